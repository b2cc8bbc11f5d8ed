// NodeAllreduce::RunSmall: the latency-bound allreduce of a small buffer
// on one node. Run's general pipeline has two waits per chunk (every
// rank's data posted, then every slice reduced by its owner) and splits
// the chunk into one slice per rank, which for a few KB is all overhead:
// here each rank posts its whole buffer, waits once for everyone's, and
// combines every slot itself. The combining is n reads of a few KB, less
// than one wait's wake-up. The slot ring and its counters are Run's, so
// the two paths may alternate call by call (their chunks share one count).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../common/reduce_kernels.h"
#include "node_allreduce.h"

namespace ddl {

bool NodeAllreduce::FitsSmall(size_t bytes) const {
  const bool across = racks_ ? grid_.all->size() > 1 : cross_ != nullptr && cross_->size() > 1;
  return !across && bytes <= arena_.slot_bytes();
}

void NodeAllreduce::RunSmall(const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                             NodePhaseTimes* times, int divisor) {
  CallFrame f(*this, spans, dtype, times, divisor);
  const int64_t count = f.walker.total();
  if (count == 0) return;
  // The caller chose this path by FitsSmall; past one slot the copy would
  // write into the next rank's slot.
  if (!FitsSmall(static_cast<size_t>(count) * f.elem)) {
    throw std::logic_error("NodeAllreduce::RunSmall given " + std::to_string(count * f.elem) +
                           " bytes, more than a slot (" + std::to_string(arena_.slot_bytes()) +
                           ") or across nodes");
  }
  Chunk& c = chunk_;
  NextSlot(&c);
  const int n = arena_.size();
  f.walker.Gather(0, count, arena_.Slot(arena_.rank(), c.slot));
  arena_.Publish(ShmArena::kPosted, c.k + 1);
  f.clock.Lap(f.t.copy_in);
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
  traffic_.intra_node_bytes += count * f.elem;
  f.clock.Lap(f.t.reduce_scatter);
}

}  // namespace ddl
