// NodeAllreduce::RunSmall: the latency-bound allreduce of a small buffer.
// Run's general pipeline has two waits per chunk (every rank's data
// posted, then every slice reduced by its owner), splits the chunk into
// one slice per rank and, across nodes, sends every slice over the
// network: for a few KB each wait and each message costs more than its
// bytes. Here each rank posts its whole buffer once.
// - On one node every rank waits once for everyone's and combines every
//   slot itself (n reads of a few KB, less than one wait's wake-up).
// - Across nodes local rank 0 (the leader) waits for the node's slots,
//   sums them into its own, runs the cross-node step on the whole buffer
//   with the other nodes' leaders (CrossNode, the general path's step),
//   and leaves the result in its slot; the other ranks wait for that once
//   and copy it out. One meeting of the node's ranks for each rank, and
//   one exchange per node instead of one per local rank.
// The slot ring and its counters are Run's, so the paths may alternate
// call by call (their chunks share one count).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../common/reduce_kernels.h"
#include "node_allreduce.h"

namespace ddl {

bool NodeAllreduce::FitsSmall(size_t bytes) const {
  return ChooseSinglePass(Across(), bytes, arena_.slot_bytes(), choice_);
}

void NodeAllreduce::RunSmall(const std::vector<Span>& spans, DataType dtype, DataType wire,
                             ReduceOp op, NodePhaseTimes* times, int divisor) {
  CallFrame f(*this, spans, dtype, times, divisor);
  const int64_t count = f.walker.total();
  if (count == 0) return;
  // Past one slot the copy would write into the next rank's slot.
  if (static_cast<size_t>(count) * f.elem > arena_.slot_bytes()) {
    throw std::logic_error("NodeAllreduce::RunSmall given " + std::to_string(count * f.elem) +
                           " bytes, more than a slot (" + std::to_string(arena_.slot_bytes()) +
                           ")");
  }
  Chunk& c = chunk_;
  NextSlot(&c);
  f.walker.Gather(0, count, arena_.Slot(arena_.rank(), c.slot));
  arena_.Publish(ShmArena::kPosted, c.k + 1);
  f.clock.Lap(f.t.copy_in);
  if (Across()) {
    SmallAcross(f, c, count, dtype, wire, op);
  } else {
    SmallOnNode(f, c, count, dtype, op);
  }
  traffic_.intra_node_bytes += count * f.elem;
}

void NodeAllreduce::SmallOnNode(CallFrame& f, const Chunk& c, int64_t count, DataType dtype,
                                ReduceOp op) {
  const int n = arena_.size();
  arena_.WaitForAll(ShmArena::kPosted, c.k + 1);
  // Every rank combines the slots in rank order ((x0 op x1) op x2) ...,
  // as Run's slice owners do, so all ranks, and both paths, give the same
  // bits. Each piece of the walk is one output's run of elements.
  auto slot = [&](int i, int64_t done) { return arena_.Slot(i, c.slot) + done * f.elem; };
  f.walker.Walk(0, count, [&](size_t, const Span& s, int64_t at, int64_t m, int64_t done) {
    char* out = static_cast<char*>(s.out) + at * f.elem;
    if (n == 1) {
      std::memcpy(out, slot(0, done), m * f.elem);
    } else {
      ReduceTo(out, slot(0, done), slot(1, done), m, dtype, op);
    }
    for (int i = 2; i < n; ++i) ReduceInto(out, slot(i, done), m, dtype, op);
    if (op == ReduceOp::kAverage) DivideBy(out, m, dtype, f.divisor);
  });
  // Done with every slot of this chunk. kReduced as well, so that the
  // counters read the same whichever path ran a chunk.
  arena_.Publish(ShmArena::kReduced, c.k + 1);
  arena_.Publish(ShmArena::kConsumed, c.k + 1);
  f.clock.Lap(f.t.reduce_scatter);
}

void NodeAllreduce::SmallAcross(CallFrame& f, const Chunk& c, int64_t count, DataType dtype,
                                DataType wire, ReduceOp op) {
  const int n = arena_.size();
  char* const result = arena_.Slot(0, c.slot);
  if (arena_.rank() == 0) {
    arena_.WaitForAll(ShmArena::kPosted, c.k + 1);
    // The node's sum in rank order, as Run's slice owners make it, then
    // the same cross-node step and division: the same bits as Run.
    for (int i = 1; i < n; ++i) ReduceInto(result, arena_.Slot(i, c.slot), count, dtype, op);
    f.clock.Lap(f.t.reduce_scatter);
    const bool divided = CrossNode(result, count, dtype, wire, op, f.divisor);
    if (op == ReduceOp::kAverage && !divided) DivideBy(result, count, dtype, f.divisor);
    f.clock.Lap(f.t.cross_node);
    arena_.Publish(ShmArena::kReduced, c.k + 1);
  } else {
    // Nothing of this rank's to reduce: its kReduced only says so, and the
    // wait is for the leader's, which comes with the result.
    arena_.Publish(ShmArena::kReduced, c.k + 1);
    arena_.WaitForAll(ShmArena::kReduced, c.k + 1);
    f.clock.Lap(f.t.cross_node);
  }
  f.walker.Scatter(0, count, result);
  arena_.Publish(ShmArena::kConsumed, c.k + 1);
  f.clock.Lap(f.t.all_gather);
}

}  // namespace ddl
