// extern "C" entry points for bindings that cannot use C++ (Python's ctypes
// uses these for init/shutdown/topology and for tests of the kernels).
#include <algorithm>
#include <iterator>
#include <cstring>
#include <string>
#include <vector>

#include "../engine/runtime.h"

namespace {
thread_local std::string last_error;

int Report(const ddl::Status& s) {
  last_error = s.message();
  return static_cast<int>(s.code());
}

// No C++ exception may cross into the C caller: it becomes an error code
// (-2) and the text of ddl_last_error(). Every entry point that can throw
// (a lock, an allocation, the engine) goes through it.
template <typename Body>
auto Guarded(Body body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    last_error = std::string("keras_ddl internal error: ") + e.what();
  } catch (...) {
    last_error = "keras_ddl internal error: unknown exception";
  }
  return static_cast<decltype(body())>(-2);
}

// One field of this rank's place in process set `set`, or -1 when it has
// none (not initialised, no such set, not a member).
template <typename Field>
int Query(Field field, int set = 0) {
  return Guarded([&] {
    ddl::Placement p;
    return ddl::PlacementIn(set, &p) ? field(p) : -1;
  });
}

// Writes at most `capacity` bytes of `text` (with the final NUL) to `out`
// when it is not null and has room for the NUL; returns the full length.
int CopyOut(const std::string& text, char* out, int capacity) {
  if (out != nullptr && capacity > 0) {
    const size_t n = std::min(text.size(), static_cast<size_t>(capacity) - 1);
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return static_cast<int>(text.size());
}

}  // namespace

extern "C" {

int ddl_init() { return Guarded([] { return Report(ddl::Initialize()); }); }
// 0, or an error code with ddl_last_error() (Python raises it).
int ddl_shutdown() {
  return Guarded([] {
    ddl::Shutdown();
    return 0;
  });
}
int ddl_is_initialized() { return Guarded([] { return ddl::Initialized() ? 1 : 0; }); }
int ddl_peer_failure_seen() { return ddl::PeerFailureSeen() ? 1 : 0; }
const char* ddl_last_error() { return last_error.c_str(); }

int ddl_rank() { return Query([](const ddl::Placement& p) { return p.rank; }); }
int ddl_size() { return Query([](const ddl::Placement& p) { return p.size; }); }
int ddl_local_rank() { return Query([](const ddl::Placement& p) { return p.local_rank; }); }
int ddl_local_size() { return Query([](const ddl::Placement& p) { return p.local_size; }); }
int ddl_cross_rank() { return Query([](const ddl::Placement& p) { return p.cross_rank; }); }
int ddl_cross_size() { return Query([](const ddl::Placement& p) { return p.cross_size; }); }
// 0 = flat ring over MPI, 1 = one node's shared memory, 2 = hierarchical,
// 3 = racks (the rack allreduce across nodes, shared memory inside them).
int ddl_allreduce_algorithm() { return Guarded([] { return ddl::AllreducePath(); }); }

// The racks the ranks agreed on, as JSON: {"racks": [names], "rack_of_rank":
// [...], "node_of_rank": [...], "nodes_per_rack": N, "source": "...",
// "used": true|false, "probe_seconds": S, "probe_verdict": "racks|one switch|unclear|",
// "probe_confirmed": true|false, "probe_checks": "...",
// "probed_by_default": true|false, "schedule": "racks|chain|pairwise|none",
// "description": "..."} (Context::DescribeNetwork). Writes at most `capacity`
// bytes (with the final NUL; nothing with a null `out` or no capacity) and
// returns the full length, or -1 when not initialised.
int ddl_topology(char* out, int capacity) {
  return Guarded([&] {
    std::string json;
    return ddl::TopologyJson(&json) ? CopyOut(json, out, capacity) : -1;
  });
}

// Collective over every rank: a process set of the `n` world ranks in
// `ranks` (sorted, distinct, the same on every rank); its id in *id.
int ddl_add_process_set(const int* ranks, int n, int* id) {
  return Guarded([&] {
    // Refused before the collective, as every rank refuses the same call.
    if (n < 0 || (n > 0 && ranks == nullptr) || id == nullptr) {
      return Report(ddl::Status::InvalidArgument(
          "add_process_set: " + std::string(n < 0 ? "n = " + std::to_string(n) + " ranks"
                                            : ranks == nullptr ? "no ranks array"
                                                               : "no place for the id") +
          " (expected n >= 0 ranks and an id pointer)"));
    }
    return Report(ddl::AddProcessSet(std::vector<int>(ranks, ranks + n), id));
  });
}

// This rank's rank in process set `id`, and the set's size; -1 when this
// rank is not a member or the set does not exist.
int ddl_process_set_rank(int id) {
  return Query([](const ddl::Placement& p) { return p.rank; }, id);
}
int ddl_process_set_size(int id) {
  return Query([](const ddl::Placement& p) { return p.size; }, id);
}

// Adds a marker to rank 0's timeline (no-op elsewhere or without one).
int ddl_timeline_mark(const char* label) {
  return Guarded([label] {
    if (!ddl::Initialized()) return -1;
    if (label == nullptr) return -3;
    return ddl::MarkTimeline(label) ? 0 : -1;
  });
}

// Bytes moved by this rank: [intra-node, cross-node, flat ring, results
// delivered in shared-memory outputs, sent by alltoall, allreduced over
// racks with one rank per node] (room for 6). Returns 0, -1 when not
// initialised, -3 without `out`.
int ddl_traffic(uint64_t* out) {
  return Guarded([out] {
    if (out == nullptr) return -3;
    ddl::TrafficTotals t;
    if (!ddl::Traffic(&t)) return -1;
    const uint64_t by_path[] = {t.intra_node, t.cross_node, t.flat, t.shared_output, t.alltoall,
                                t.racks};
    std::copy(std::begin(by_path), std::end(by_path), out);
    return 0;
  });
}

// The fusion threshold (MB) and cycle time (ms) in force, which
// DDL_AUTOTUNE=1 may have changed, in out[0] and out[1]
// (keras_ddl.settings_in_force). Returns 0, -1 when not initialised, -3
// without `out`.
int ddl_settings_in_force(double* out) {
  return Guarded([out] {
    if (out == nullptr) return -3;
    return ddl::SettingsInForce(&out[0], &out[1]) ? 0 : -1;
  });
}

// This process's probe responder port: 0 when it has none, -1 when not
// initialised (ddl::ProbePort).
int ddl_probe_port() { return Guarded([] { return ddl::ProbePort(); }); }

// The MPI library this core was linked against, to check that mpi4py in
// the same process uses the same one. Writes as ddl_topology does.
int ddl_mpi_library_version(char* out, int capacity);

// Float <-> 16-bit conversions, exposed so tests compare them with numpy.
uint16_t ddl_float_to_half(float f) { return ddl::KernelFloatToHalf(f); }
float ddl_half_to_float(uint16_t h) { return ddl::KernelHalfToFloat(h); }
uint16_t ddl_float_to_bfloat16(float f) { return ddl::KernelFloatToBFloat16(f); }
float ddl_bfloat16_to_float(uint16_t b) { return ddl::KernelBFloat16ToFloat(b); }

}  // extern "C"

extern "C" int ddl_mpi_library_version(char* out, int capacity) {
  return Guarded([&] { return CopyOut(ddl::TransportLibraryVersion(), out, capacity); });
}
