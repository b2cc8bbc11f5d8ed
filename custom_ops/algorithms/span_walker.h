// The tensors of a fused allreduce seen as one run of elements: copies and
// reductions over element ranges that cross tensor boundaries.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../common/reduce_kernels.h"
#include "../common/types.h"

namespace ddl {

// One tensor's part of a fused allreduce: `count` elements read from `in`
// and written to `out` (which may equal `in`).
struct Span {
  const void* in;
  void* out;
  int64_t count;
};

// Elements [first, first + count) of the concatenated spans, copied to or
// from a contiguous buffer, reduced, or visited piece by piece.
class SpanWalker {
 public:
  // `storage`, if given, holds the spans' starts instead of a vector of
  // the walker's own: a caller that keeps it across calls of the same
  // shape allocates nothing on its steady path.
  SpanWalker(const std::vector<Span>& spans, size_t elem,
             std::vector<int64_t>* storage = nullptr)
      : spans_(spans), elem_(elem), starts_(storage ? *storage : own_starts_) {
    starts_.clear();
    starts_.reserve(spans.size() + 1);
    int64_t total = 0;
    for (const Span& s : spans) {
      starts_.push_back(total);
      total += s.count;
    }
    starts_.push_back(total);
  }
  SpanWalker(const SpanWalker&) = delete;
  SpanWalker& operator=(const SpanWalker&) = delete;

  size_t elem_size() const { return elem_; }
  int64_t total() const { return starts_.back(); }

  void Gather(int64_t first, int64_t count, char* dst) const {
    Walk(first, count, [&](size_t, const Span& s, int64_t at, int64_t n, int64_t done) {
      std::memcpy(dst + done * elem_, static_cast<const char*>(s.in) + at * elem_, n * elem_);
    });
  }
  void Scatter(int64_t first, int64_t count, const char* src) const {
    Walk(first, count, [&](size_t, const Span& s, int64_t at, int64_t n, int64_t done) {
      std::memcpy(static_cast<char*>(s.out) + at * elem_, src + done * elem_, n * elem_);
    });
  }
  // dst = dst op input (or, with `with` given, dst = input op with) over
  // elements [first, first + count), reading the input where it lies.
  void ReduceFromInput(int64_t first, int64_t count, char* dst, const char* with,
                       DataType dtype, ReduceOp op) const {
    Walk(first, count, [&](size_t, const Span& s, int64_t at, int64_t n, int64_t done) {
      const char* in = static_cast<const char*>(s.in) + at * elem_;
      if (with) {
        ReduceTo(dst + done * elem_, in, with + done * elem_, n, dtype, op);
      } else {
        ReduceInto(dst + done * elem_, in, n, dtype, op);
      }
    });
  }

  // Calls fn(index, span, at, n, done) for each piece of elements
  // [first, first + count): n elements from element `at` of span `index`,
  // the piece starting `done` elements after `first`.
  template <typename Fn>
  void Walk(int64_t first, int64_t count, Fn fn) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), first) - 1;
    size_t i = static_cast<size_t>(it - starts_.begin());
    int64_t done = 0;
    while (done < count) {
      int64_t at = first + done - starts_[i];
      int64_t n = std::min(spans_[i].count - at, count - done);
      if (n > 0) fn(i, spans_[i], at, n, done);
      done += n;
      ++i;
    }
  }

 private:
  const std::vector<Span>& spans_;
  size_t elem_;
  std::vector<int64_t> own_starts_;  // unused when the caller gave storage
  std::vector<int64_t>& starts_;     // starts_[i]: span i's first element; then the total
};

}  // namespace ddl
