// Allreduce through a node's shared memory, optionally hierarchical:
// each chunk of the buffer is copied into the ranks' shared slots; rank i
// reduces slice i of the chunk across all slots (intra-node reduce-scatter);
// with a cross-node transport, rank i then allreduces its slice with the
// ranks of the same local rank on other nodes; finally every rank copies
// all reduced slices out (intra-node all-gather). Chunks go through a ring
// of slots, so while one rank reduces or talks across nodes on chunk k, a
// faster one is already copying in chunk k+1.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "../common/traffic.h"
#include "../common/types.h"
#include "../transport/shm_arena.h"
#include "../transport/transport.h"
#include "rack_allreduce.h"
#include "span_walker.h"

namespace ddl {

// Seconds spent in each phase, accumulated over chunks (phases of
// different chunks interleave, so these are totals, not intervals).
struct NodePhaseTimes {
  double copy_in = 0;
  double reduce_scatter = 0;
  double cross_node = 0;
  double all_gather = 0;
};

// Adds the time since the previous lap (or construction) to a phase's total.
class PhaseClock {
 public:
  void Lap(double& phase) {
    const auto now = std::chrono::steady_clock::now();
    phase += std::chrono::duration<double>(now - tick_).count();
    tick_ = now;
  }

 private:
  std::chrono::steady_clock::time_point tick_ = std::chrono::steady_clock::now();
};

// Where results go instead of each span's `out`: one block of node shared
// memory that every local rank's outputs view; span i's result starts at
// block + at[i].
struct SharedResult {
  char* block;
  const std::vector<size_t>* at;
};

class NodeAllreduce {
 public:
  // `cross` may be null (single node). `world_size` divides Average.
  NodeAllreduce(ShmArena& arena, Transport* cross, int world_size, TrafficCounters& traffic)
      : arena_(arena), cross_(cross), world_size_(world_size), traffic_(traffic) {}

  // `wire` is the dtype the cross-node step sends (see Convert): `dtype`,
  // or a 16-bit float for a float32 buffer, which halves the bytes on the
  // network while the node's ranks still sum in float32. `times`, if given,
  // receives the time spent per phase. With `into`, the owner of each
  // slice writes it there, once for the node, and nobody copies results
  // out; the call returns when the whole result is there.
  // With racks, the cross-node step runs over `grid` (this local rank's
  // column of nodes seen as racks, rack_allreduce.h) instead of `cross`;
  // the grid's transports must outlive this object.
  void UseRacks(const RackGrid& grid) { grid_ = grid; racks_ = true; }
  // The algorithm of the cross-node step (allreduce.h) for the calls that
  // follow, until changed; kAuto (the default) is the size rule. Every
  // rank must set the same choice before the same call.
  void SetNetworkChoice(NetworkChoice choice) { choice_ = choice; }
  // What the size rule of the cross-node step may assume of the network
  // (allreduce.h); one switch unless set. The same on every rank.
  void SetNetworkShape(NetworkShape shape) { shape_ = shape; }

  // Average divides by `divisor` (0: the world size; the engine passes the
  // ranks still active while some have joined). Over a 16-bit wire the
  // node's float32 sum is divided as it is converted, before the cross-node
  // sum (ConvertDivided), so that sum cannot overflow where the float32
  // average would not.
  void Run(const std::vector<Span>& spans, DataType dtype, DataType wire, ReduceOp op,
           NodePhaseTimes* times = nullptr, const SharedResult* into = nullptr,
           int divisor = 0);

  // The latency-bound path for a buffer of at most one slot: one pass.
  // On one node its only wait is for every local rank's data in its slot;
  // each rank then combines all the slots itself, in rank order, straight
  // into its outputs. Across nodes local rank 0 sums the node's slots,
  // runs the cross-node step (in `wire`, as Run) with the other nodes'
  // rank 0s and shares the result; the others wait for it once. Both give
  // Run's bits. Average divides by `divisor` (0: the world size).
  // node_small_allreduce.cc.
  void RunSmall(const std::vector<Span>& spans, DataType dtype, DataType wire, ReduceOp op,
                NodePhaseTimes* times = nullptr, int divisor = 0);
  // Whether a call of `bytes` takes RunSmall: ChooseSinglePass
  // (topology/choose_allreduce.h) with this node's cross-node step, slot
  // and network choice (SetNetworkChoice).
  bool FitsSmall(size_t bytes) const;
  // Whether a call has a cross-node step (over `cross` or the grid).
  bool Across() const;

 private:
  // What both paths set up when a call starts: the walker over its spans
  // (its storage is span_starts_, kept from call to call), the divisor
  // Average uses, and a clock that adds each phase's time to the caller's
  // totals, or to the frame's own when the caller wants none.
  struct CallFrame {
    CallFrame(NodeAllreduce& self, const std::vector<Span>& spans, DataType dtype,
              NodePhaseTimes* times, int divisor)
        : t(times ? *times : own_times),
          divisor(divisor > 0 ? divisor : self.world_size_),
          elem(DataTypeSize(dtype)),
          walker(spans, elem, &self.span_starts_) {}
    NodePhaseTimes own_times;
    NodePhaseTimes& t;
    PhaseClock clock;
    const int divisor;
    const size_t elem;
    const SpanWalker walker;
  };
  // One chunk of a call: at most one slot, split into one slice per local
  // rank (slice[i] elements at offset[i]), the k-th chunk of the arena.
  struct Chunk {
    uint64_t k = 0;
    int slot = 0;
    int64_t first = 0, count = 0;  // elements of the call's spans
    std::vector<int64_t> slice, offset;
  };
  // RunSmall's two cases, after every rank posted its buffer in chunk c.
  void SmallOnNode(CallFrame& f, const Chunk& c, int64_t count, DataType dtype, ReduceOp op);
  void SmallAcross(CallFrame& f, const Chunk& c, int64_t count, DataType dtype, DataType wire,
                   ReduceOp op);
  // A chunk's phases, in order. StartChunk fills `c` in place: the engine
  // keeps one Chunk, so a steady call allocates nothing.
  void StartChunk(int64_t first, int64_t count, Chunk* c);
  // The next chunk's number and slot, once that slot is free again.
  void NextSlot(Chunk* c);
  void CopyIn(const SpanWalker& walker, const Chunk& c);
  // Returns this rank's reduced slice, in its slot.
  char* ReduceOwnSlice(const SpanWalker& walker, const Chunk& c, DataType dtype, ReduceOp op);
  // True if it divided `mine` for Average (on the way to a 16-bit wire).
  bool CrossNode(char* mine, int64_t count, DataType dtype, DataType wire, ReduceOp op,
                 int divisor);
  void WriteOwnSlice(const SpanWalker& walker, const Chunk& c, const char* mine,
                     const SharedResult& into);
  void CopyOut(const SpanWalker& walker, const Chunk& c);

  ShmArena& arena_;
  Transport* cross_;
  RackGrid grid_{};
  bool racks_ = false;
  NetworkChoice choice_ = NetworkChoice::kAuto;
  NetworkShape shape_ = NetworkShape::kOneSwitch;
  int world_size_;
  TrafficCounters& traffic_;
  uint64_t chunks_done_ = 0;  // same on every local rank: they run the same calls
  Chunk chunk_;                      // the chunk in flight, reused
  std::vector<int64_t> span_starts_;  // the walker's storage, reused
  std::vector<char> wire_slice_;  // a slice in the wire dtype, when that differs
};

}  // namespace ddl
