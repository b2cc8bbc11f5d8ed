#include "node_allreduce.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "../core/reduce_kernels.h"
#include "ring.h"

namespace ddl {

namespace {

// Copies elements [first, first + count) of the concatenated spans to or
// from a contiguous buffer.
class SpanWalker {
 public:
  SpanWalker(const std::vector<Span>& spans, size_t elem) : spans_(spans), elem_(elem) {
    starts_.reserve(spans.size() + 1);
    int64_t total = 0;
    for (const Span& s : spans) {
      starts_.push_back(total);
      total += s.count;
    }
    starts_.push_back(total);
  }
  int64_t total() const { return starts_.back(); }

  void Gather(int64_t first, int64_t count, char* dst) const {
    Walk(first, count, [&](const Span& s, int64_t at, int64_t n, int64_t done) {
      std::memcpy(dst + done * elem_, static_cast<const char*>(s.in) + at * elem_, n * elem_);
    });
  }
  void Scatter(int64_t first, int64_t count, const char* src) const {
    Walk(first, count, [&](const Span& s, int64_t at, int64_t n, int64_t done) {
      std::memcpy(static_cast<char*>(s.out) + at * elem_, src + done * elem_, n * elem_);
    });
  }

 private:
  template <typename Fn>
  void Walk(int64_t first, int64_t count, Fn fn) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), first) - 1;
    size_t i = static_cast<size_t>(it - starts_.begin());
    int64_t done = 0;
    while (done < count) {
      int64_t at = first + done - starts_[i];
      int64_t n = std::min(spans_[i].count - at, count - done);
      if (n > 0) fn(spans_[i], at, n, done);
      done += n;
      ++i;
    }
  }
  const std::vector<Span>& spans_;
  size_t elem_;
  std::vector<int64_t> starts_;
};

}  // namespace

void NodeAllreduce::Run(const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                        NodePhaseTimes* times) {
  using Clock = std::chrono::steady_clock;
  NodePhaseTimes local_times;
  NodePhaseTimes& t = times ? *times : local_times;
  auto tick = Clock::now();
  // Adds the time since the last call to `phase`.
  auto lap = [&tick](double& phase) {
    auto now = Clock::now();
    phase += std::chrono::duration<double>(now - tick).count();
    tick = now;
  };
  const size_t elem = DataTypeSize(dtype);
  const SpanWalker walker(spans, elem);
  const int n = arena_.size();
  const int me = arena_.rank();
  const int slots = arena_.slots_per_rank();
  const int64_t chunk_elems = static_cast<int64_t>(arena_.slot_bytes() / elem);
  const bool across = cross_ != nullptr && cross_->size() > 1;
  // Across nodes the slice is summed first and divided once at the end.
  const ReduceOp cross_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;

  for (int64_t first = 0; first < walker.total(); first += chunk_elems) {
    const int64_t count = std::min(chunk_elems, walker.total() - first);
    const uint64_t k = chunks_done_++;
    const int slot = static_cast<int>(k % slots);
    // The slot last held chunk k - slots; wait until every rank copied it out.
    if (k >= static_cast<uint64_t>(slots)) arena_.WaitForAll(ShmArena::kConsumed, k - slots + 1);
    walker.Gather(first, count, arena_.Slot(me, slot));
    arena_.Publish(ShmArena::kPosted, k + 1);
    lap(t.copy_in);

    const std::vector<int64_t> slice = EvenSegments(count, n);
    std::vector<int64_t> offset(n + 1, 0);
    for (int i = 0; i < n; ++i) offset[i + 1] = offset[i] + slice[i];
    char* mine = arena_.Slot(me, slot) + offset[me] * elem;
    arena_.WaitForAll(ShmArena::kPosted, k + 1);
    // Each slice has one owner, so every rank later copies out identical
    // bytes. The owner adds the local ranks' values in rank order
    // ((x0 + x1) + x2) + ..., whoever it is, so an element's sum does not
    // depend on which slice it falls in: the same tensors give the same
    // bits however they are fused into chunks. Owners 0 and 1 start from
    // their own slot (x1 + x0 == x0 + x1 exactly); a later owner parks its
    // values and starts from rank 0's.
    const size_t slice_bytes = static_cast<size_t>(slice[me]) * elem;
    if (me >= 2 && slice_bytes > 0) {
      parked_.resize(slice_bytes);
      std::memcpy(parked_.data(), mine, slice_bytes);
      std::memcpy(mine, arena_.Slot(0, slot) + offset[me] * elem, slice_bytes);
    }
    for (int i = me >= 2 ? 1 : 0; i < n; ++i) {
      if (i == me && me < 2) continue;  // already in `mine`
      const char* values = i == me ? parked_.data() : arena_.Slot(i, slot) + offset[me] * elem;
      ReduceInto(mine, values, slice[me], dtype, op);
    }
    lap(t.reduce_scatter);
    if (across && slice[me] > 0) {
      RingAllreduce(*cross_, mine, slice[me], dtype, cross_op);
      traffic_.cross_node_bytes += slice[me] * elem;
    }
    lap(t.cross_node);
    if (op == ReduceOp::kAverage) DivideBy(mine, slice[me], dtype, world_size_);
    arena_.Publish(ShmArena::kReduced, k + 1);

    arena_.WaitForAll(ShmArena::kReduced, k + 1);
    for (int i = 0; i < n; ++i) {
      walker.Scatter(first + offset[i], slice[i], arena_.Slot(i, slot) + offset[i] * elem);
    }
    arena_.Publish(ShmArena::kConsumed, k + 1);
    traffic_.intra_node_bytes += 2 * count * elem;
    lap(t.all_gather);
  }
}

}  // namespace ddl
