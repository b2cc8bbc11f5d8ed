#include "node_allreduce.h"

#include <algorithm>
#include <cstring>

#include "../common/reduce_kernels.h"
#include "allreduce.h"
#include "ring.h"
#include "span_walker.h"

namespace ddl {

void NodeAllreduce::Run(const std::vector<Span>& spans, DataType dtype, DataType wire,
                        ReduceOp op, NodePhaseTimes* times, const SharedResult* into,
                        int divisor) {
  CallFrame f(*this, spans, dtype, times, divisor);
  const int64_t chunk_elems = static_cast<int64_t>(arena_.slot_bytes() / f.elem);
  // Each chunk of at most one slot passes through the four phases; chunks
  // of successive calls continue the count (chunks_done_), as the slots do.
  for (int64_t first = 0; first < f.walker.total(); first += chunk_elems) {
    Chunk& c = chunk_;
    StartChunk(first, std::min(chunk_elems, f.walker.total() - first), &c);
    CopyIn(f.walker, c);
    f.clock.Lap(f.t.copy_in);
    char* mine = ReduceOwnSlice(f.walker, c, dtype, op);
    f.clock.Lap(f.t.reduce_scatter);
    const bool divided = CrossNode(mine, c.slice[arena_.rank()], dtype, wire, op, f.divisor);
    f.clock.Lap(f.t.cross_node);
    if (op == ReduceOp::kAverage && !divided) {
      DivideBy(mine, c.slice[arena_.rank()], dtype, f.divisor);
    }
    traffic_.intra_node_bytes += 2 * c.count * f.elem;
    if (into != nullptr) {
      WriteOwnSlice(f.walker, c, mine, *into);
    } else {
      CopyOut(f.walker, c);
    }
    f.clock.Lap(f.t.all_gather);
  }
  // Every owner has written its slices of every chunk.
  if (into != nullptr && f.walker.total() > 0) arena_.WaitForAll(ShmArena::kReduced, chunks_done_);
  f.clock.Lap(f.t.all_gather);
}

void NodeAllreduce::NextSlot(Chunk* c) {
  c->k = chunks_done_++;
  c->slot = static_cast<int>(c->k % arena_.slots_per_rank());
  // The slot last held chunk k - slots; wait until every rank copied it out.
  const uint64_t slots = static_cast<uint64_t>(arena_.slots_per_rank());
  if (c->k >= slots) arena_.WaitForAll(ShmArena::kConsumed, c->k - slots + 1);
}

void NodeAllreduce::StartChunk(int64_t first, int64_t count, Chunk* c) {
  c->first = first;
  c->count = count;
  NextSlot(c);
  // Even slices, the first count % n one element longer (EvenSegments),
  // in vectors that keep their capacity from call to call.
  const int n = arena_.size();
  c->slice.assign(n, count / n);
  for (int i = 0; i < count % n; ++i) c->slice[i] += 1;
  c->offset.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) c->offset[i + 1] = c->offset[i] + c->slice[i];
}

void NodeAllreduce::CopyIn(const SpanWalker& walker, const Chunk& c) {
  const int me = arena_.rank();
  const size_t elem = walker.elem_size();
  char* const own_slot = arena_.Slot(me, c.slot);
  // Only the other ranks' slices are copied in: this rank reduces its own
  // slice straight from its input, which saves a pass over 1/n of it.
  walker.Gather(c.first, c.offset[me], own_slot);
  walker.Gather(c.first + c.offset[me + 1], c.count - c.offset[me + 1],
                own_slot + c.offset[me + 1] * elem);
  arena_.Publish(ShmArena::kPosted, c.k + 1);
}

char* NodeAllreduce::ReduceOwnSlice(const SpanWalker& walker, const Chunk& c, DataType dtype,
                                    ReduceOp op) {
  const int n = arena_.size();
  const int me = arena_.rank();
  const size_t elem = walker.elem_size();
  char* mine = arena_.Slot(me, c.slot) + c.offset[me] * elem;
  arena_.WaitForAll(ShmArena::kPosted, c.k + 1);
  // Each slice has one owner, so every rank later copies out identical
  // bytes. The owner combines the local ranks' values in rank order
  // ((x0 + x1) + x2) + ..., whoever it is, so an element's result does
  // not depend on which slice it falls in: the same tensors give the same
  // bits however they are fused into chunks (x1 + x0 == x0 + x1 exactly).
  const int64_t own_first = c.first + c.offset[me];
  const int64_t m = c.slice[me];
  auto from = [&](int i) { return arena_.Slot(i, c.slot) + c.offset[me] * elem; };
  if (m == 0) return mine;
  if (n == 1) {
    walker.Gather(own_first, m, mine);
  } else if (me < 2) {
    walker.ReduceFromInput(own_first, m, mine, from(1 - me), dtype, op);
  } else {
    ReduceTo(mine, from(0), from(1), m, dtype, op);
  }
  // Ranks 0 and 1 are in; the rest follow in rank order.
  for (int i = 2; i < n; ++i) {
    if (i == me) {
      walker.ReduceFromInput(own_first, m, mine, nullptr, dtype, op);
    } else {
      ReduceInto(mine, from(i), m, dtype, op);
    }
  }
  return mine;
}

bool NodeAllreduce::Across() const {
  return racks_ ? grid_.all->size() > 1 : cross_ != nullptr && cross_->size() > 1;
}

bool NodeAllreduce::CrossNode(char* mine, int64_t count, DataType dtype, DataType wire,
                              ReduceOp op, int divisor) {
  if (!Across() || count == 0) return false;
  // Across nodes the slice is summed, and divided once for Average: at the
  // end in the slice's own dtype, or, over a 16-bit wire, as the node sum
  // is converted (a node sum of float16-sized values can exceed 65504).
  const ReduceOp cross_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  const bool divide_first = op == ReduceOp::kAverage && wire != dtype;
  // In another wire dtype the slice is converted per chunk, so while this
  // rank converts, the other local ranks' slices are on the network.
  const size_t wire_bytes = count * DataTypeSize(wire);
  char* sent = mine;
  if (wire != dtype) {
    if (wire_slice_.size() < wire_bytes) wire_slice_.resize(wire_bytes);
    sent = wire_slice_.data();
    if (divide_first) {
      ConvertDivided(sent, wire, mine, dtype, count, divisor);
    } else {
      Convert(sent, wire, mine, dtype, count);
    }
  }
  if (racks_) {
    RackGridAllreduce(grid_, sent, count, wire, cross_op, RackSlicePieceBytes(wire_bytes),
                      choice_);
  } else {
    FlatAlgorithm(ChooseAllreduce(cross_->size(), wire_bytes, choice_, shape_))
        .run(*cross_, sent, count, wire, cross_op);
  }
  if (wire != dtype) Convert(mine, dtype, sent, wire, count);
  traffic_.cross_node_bytes += wire_bytes;
  return divide_first;
}

void NodeAllreduce::WriteOwnSlice(const SpanWalker& walker, const Chunk& c, const char* mine,
                                  const SharedResult& into) {
  const int me = arena_.rank();
  const size_t elem = walker.elem_size();
  // The slice goes from this rank's cache straight to its place in the
  // result; having reduced it, this rank is done with every slot of chunk k.
  walker.Walk(c.first + c.offset[me], c.slice[me],
              [&](size_t i, const Span&, int64_t e, int64_t m, int64_t done) {
                std::memcpy(into.block + (*into.at)[i] + e * elem, mine + done * elem, m * elem);
              });
  arena_.Publish(ShmArena::kReduced, c.k + 1);
  arena_.Publish(ShmArena::kConsumed, c.k + 1);
}

void NodeAllreduce::CopyOut(const SpanWalker& walker, const Chunk& c) {
  const size_t elem = walker.elem_size();
  arena_.Publish(ShmArena::kReduced, c.k + 1);
  arena_.WaitForAll(ShmArena::kReduced, c.k + 1);
  for (int i = 0; i < arena_.size(); ++i) {
    walker.Scatter(c.first + c.offset[i], c.slice[i], arena_.Slot(i, c.slot) + c.offset[i] * elem);
  }
  arena_.Publish(ShmArena::kConsumed, c.k + 1);
}

}  // namespace ddl
