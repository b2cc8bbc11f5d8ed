// The process's running engines: the global one (every rank) and one per
// process set this rank belongs to. Framework bindings (the TensorFlow op
// file, the ctypes C API) reach the core only through these functions:
// enqueue (Submit), wait (a Work's done callback), the ranks and topology,
// timeline marks, counters and the kernels' dtype conversions. This header
// includes no other engine header but work.h, so a binding sees none of the
// engine, the context or the layers under them, and the bindings include no
// other header of the core (tests/docs/test_layout.py checks both).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "work.h"

namespace ddl {

// Starts the global engine unless it is running (idempotent).
Status Initialize();
// Stops every engine (idempotent); in-flight collectives fail with Aborted.
void Shutdown();
// Whether the global engine runs.
bool Initialized();
// Whether this process saw a peer fail (its engines then end the process
// or fail every work: Engine::OnPeerFailure).
bool PeerFailureSeen();

// Collective over every rank of the job, which must all pass the same
// sorted, distinct world ranks: a process set of those ranks, with its own
// engine on its members. *id receives the set's number (the same on every
// rank; the global set is 0).
Status AddProcessSet(const std::vector<int>& ranks, int* id);

// Enqueues to process set `set`'s engine, or fails every work (not
// initialised, unknown set, or this rank is not a member). `drive`: the
// caller blocks until the works are done anyway, so it may run the cycles
// itself (Engine::EnqueueAndDrive). Each work's `done` is its wait.
void Submit(std::vector<Work> works, int set = 0, bool drive = false);

// Where this rank stands in process set `set` (0: the job).
struct Placement {
  int rank = -1, size = -1;
  int local_rank = -1, local_size = -1;  // on its node (0 ... local_size - 1)
  int cross_rank = -1, cross_size = -1;  // among the ranks of its local rank
};
// False when not initialised, the set does not exist, or this rank is not
// a member.
bool PlacementIn(int set, Placement* out);

// The allreduce path of the job: 0 flat, 1 one node's shared memory, 2
// hierarchical, 3 racks; -1 when not initialised.
int AllreducePath();

// The racks the ranks agreed on and what allreduces across nodes run, as
// ddl_topology's JSON (bindings/c_api.cc documents its fields). False when
// not initialised.
bool TopologyJson(std::string* out);

// Adds a marker to rank 0's timeline (nothing elsewhere or without one).
// False when not initialised.
bool MarkTimeline(const std::string& label);

// Bytes this rank moved, by path (common/traffic.h names each).
struct TrafficTotals {
  uint64_t intra_node = 0, cross_node = 0, flat = 0, shared_output = 0, alltoall = 0,
           racks = 0;
};
// False when not initialised.
bool Traffic(TrafficTotals* out);

// The fusion threshold (MB) and cycle time (ms) in force, which
// DDL_AUTOTUNE=1 may have changed. False when not initialised.
bool SettingsInForce(double* fusion_threshold_mb, double* cycle_time_ms);

// The TCP port of this process's probe responder (health/fault_report.h),
// which the other ranks probe when a wait runs long: 0 when it could not
// open one, -1 when not initialised.
int ProbePort();

// The library under the world's transport (MPI_Get_library_version for MPI).
std::string TransportLibraryVersion();

// Float <-> 16-bit conversions as the reduction kernels do them
// (common/reduce_kernels.h), here so the C API can hand them to the tests
// that compare them with numpy's without including a header under this one.
uint16_t KernelFloatToHalf(float f);
float KernelHalfToFloat(uint16_t h);
uint16_t KernelFloatToBFloat16(float f);
float KernelBFloat16ToFloat(uint16_t b);

}  // namespace ddl
