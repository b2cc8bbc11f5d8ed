#include "node_allreduce.h"

#include <algorithm>
#include <cstring>

#include "../common/reduce_kernels.h"
#include "allreduce.h"
#include "ring.h"
#include "span_walker.h"

namespace ddl {

void NodeAllreduce::Run(const std::vector<Span>& spans, DataType dtype, DataType wire,
                        ReduceOp op, NodePhaseTimes* times, const SharedResult* into) {
  NodePhaseTimes local_times;
  NodePhaseTimes& t = times ? *times : local_times;
  PhaseClock clock;
  const size_t elem = DataTypeSize(dtype);
  const SpanWalker walker(spans, elem);
  const int n = arena_.size();
  const int me = arena_.rank();
  const int slots = arena_.slots_per_rank();
  const int64_t chunk_elems = static_cast<int64_t>(arena_.slot_bytes() / elem);
  const bool across = racks_ ? grid_.all->size() > 1 : cross_ != nullptr && cross_->size() > 1;
  // Across nodes the slice is summed first and divided once at the end.
  const ReduceOp cross_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;

  for (int64_t first = 0; first < walker.total(); first += chunk_elems) {
    const int64_t count = std::min(chunk_elems, walker.total() - first);
    const uint64_t k = chunks_done_++;
    const int slot = static_cast<int>(k % slots);
    // The slot last held chunk k - slots; wait until every rank copied it out.
    if (k >= static_cast<uint64_t>(slots)) arena_.WaitForAll(ShmArena::kConsumed, k - slots + 1);
    const std::vector<int64_t> slice = EvenSegments(count, n);
    std::vector<int64_t> offset(n + 1, 0);
    for (int i = 0; i < n; ++i) offset[i + 1] = offset[i] + slice[i];
    char* const own_slot = arena_.Slot(me, slot);
    // Only the other ranks' slices are copied in: this rank reduces its own
    // slice straight from its input, which saves a pass over 1/n of it.
    walker.Gather(first, offset[me], own_slot);
    walker.Gather(first + offset[me + 1], count - offset[me + 1], own_slot + offset[me + 1] * elem);
    arena_.Publish(ShmArena::kPosted, k + 1);
    clock.Lap(t.copy_in);

    char* mine = own_slot + offset[me] * elem;
    arena_.WaitForAll(ShmArena::kPosted, k + 1);
    // Each slice has one owner, so every rank later copies out identical
    // bytes. The owner combines the local ranks' values in rank order
    // ((x0 + x1) + x2) + ..., whoever it is, so an element's result does
    // not depend on which slice it falls in: the same tensors give the same
    // bits however they are fused into chunks (x1 + x0 == x0 + x1 exactly).
    const int64_t own_first = first + offset[me];
    auto from = [&](int i) { return arena_.Slot(i, slot) + offset[me] * elem; };
    if (slice[me] > 0) {
      if (n == 1) {
        walker.Gather(own_first, slice[me], mine);
      } else if (me < 2) {
        walker.ReduceFromInput(own_first, slice[me], mine, from(1 - me), dtype, op);
      } else {
        ReduceTo(mine, from(0), from(1), slice[me], dtype, op);
      }
      for (int i = 2; i < n; ++i) {
        if (i == me) {
          walker.ReduceFromInput(own_first, slice[me], mine, nullptr, dtype, op);
        } else {
          ReduceInto(mine, from(i), slice[me], dtype, op);
        }
      }
    }
    clock.Lap(t.reduce_scatter);
    if (across && slice[me] > 0) {
      // In another wire dtype the slice is converted per chunk, so while
      // this rank converts, the other local ranks' slices are on the network.
      const size_t wire_bytes = slice[me] * DataTypeSize(wire);
      char* sent = mine;
      if (wire != dtype) {
        if (wire_slice_.size() < wire_bytes) wire_slice_.resize(wire_bytes);
        sent = wire_slice_.data();
        Convert(sent, wire, mine, dtype, slice[me]);
      }
      if (racks_) {
        // Pieces of an eighth of the slice keep the schedule's four stages
        // overlapped within this chunk.
        const size_t piece = std::clamp<size_t>(wire_bytes / 8, 64 << 10, kRackPieceBytes);
        RackGridAllreduce(grid_, sent, slice[me], wire, cross_op, piece);
      } else {
        ChooseAllreduce(cross_->size(), wire_bytes).run(*cross_, sent, slice[me], wire, cross_op);
      }
      if (wire != dtype) Convert(mine, dtype, sent, wire, slice[me]);
      traffic_.cross_node_bytes += wire_bytes;
    }
    clock.Lap(t.cross_node);
    if (op == ReduceOp::kAverage) DivideBy(mine, slice[me], dtype, world_size_);
    traffic_.intra_node_bytes += 2 * count * elem;
    if (into != nullptr) {
      // The slice goes from this rank's cache straight to its place in the
      // result; having reduced it, this rank is done with every slot of
      // chunk k.
      walker.Walk(own_first, slice[me],
                  [&](size_t i, const Span&, int64_t e, int64_t m, int64_t done) {
                    std::memcpy(into->block + (*into->at)[i] + e * elem, mine + done * elem,
                                m * elem);
                  });
      arena_.Publish(ShmArena::kReduced, k + 1);
      arena_.Publish(ShmArena::kConsumed, k + 1);
      clock.Lap(t.all_gather);
      continue;
    }
    arena_.Publish(ShmArena::kReduced, k + 1);

    arena_.WaitForAll(ShmArena::kReduced, k + 1);
    for (int i = 0; i < n; ++i) {
      walker.Scatter(first + offset[i], slice[i], arena_.Slot(i, slot) + offset[i] * elem);
    }
    arena_.Publish(ShmArena::kConsumed, k + 1);
    clock.Lap(t.all_gather);
  }
  // Every owner has written its slices of every chunk.
  if (into != nullptr && walker.total() > 0) arena_.WaitForAll(ShmArena::kReduced, chunks_done_);
  clock.Lap(t.all_gather);
}

}  // namespace ddl
