#include "pairwise.h"

#include <algorithm>
#include <cstring>

#include "../core/reduce_kernels.h"
#include "ring.h"

namespace ddl {

namespace {

constexpr int kTagPairwise = 103;

// Elements per message. Each rank holds two chunks per peer in scratch, so
// the chunk shrinks as peers grow (at most ~8 MB of scratch), but not below
// what keeps per-message overhead small.
int64_t ChunkElems(int n, size_t elem) {
  const size_t budget = (size_t(8) << 20) / (2 * static_cast<size_t>(n - 1));
  const size_t bytes = std::clamp<size_t>(budget, 16 << 10, 256 << 10);
  return static_cast<int64_t>(bytes / elem);
}

}  // namespace

void PairwiseReduceScatter(Transport& t, void* buffer, const std::vector<int64_t>& counts,
                           DataType dtype, ReduceOp op) {
  const int n = t.size();
  const int me = t.rank();
  if (n == 1) return;
  const size_t elem = DataTypeSize(dtype);
  char* base = static_cast<char*>(buffer);
  std::vector<int64_t> offset(n + 1, 0);
  for (int r = 0; r < n; ++r) offset[r + 1] = offset[r] + counts[r];
  const int64_t chunk = ChunkElems(n, elem);
  auto chunks_of = [&](int r) { return (counts[r] + chunk - 1) / chunk; };
  auto chunk_len = [&](int r, int64_t k) { return std::min(chunk, counts[r] - k * chunk); };
  int64_t steps = 0;
  for (int r = 0; r < n; ++r) steps = std::max(steps, chunks_of(r));

  // Two landing areas per peer (chunk k lands in area k % 2), plus a copy
  // of this rank's own chunk when it is not among the first two summands.
  const size_t area = static_cast<size_t>(chunk) * elem;
  std::vector<char> scratch((2 * static_cast<size_t>(n - 1) + 1) * area);
  auto landing = [&](int peer, int64_t k) {
    const int index = peer < me ? peer : peer - 1;
    return scratch.data() + (static_cast<size_t>(k % 2) * (n - 1) + index) * area;
  };
  char* own_copy = scratch.data() + 2 * static_cast<size_t>(n - 1) * area;
  char* const mine = base + offset[me] * elem;

  std::vector<Transport::Handle> recvs(n, -1);
  auto post_recvs = [&](int64_t k) {
    for (int p = 0; p < n; ++p) {
      if (p != me) recvs[p] = t.Irecv(landing(p, k), chunk_len(me, k) * elem, p, kTagPairwise);
    }
  };
  // Sends of chunk k, kept until chunk k+1's are posted: at most two chunks
  // per peer in flight, so a slow peer never has the whole buffer queued.
  std::vector<Transport::Handle> sending, sent;
  if (chunks_of(me) > 0) post_recvs(0);
  for (int64_t k = 0; k < steps; ++k) {
    sent.swap(sending);
    sending.clear();
    for (int p = 0; p < n; ++p) {
      if (p == me || k >= chunks_of(p)) continue;
      sending.push_back(t.Isend(base + (offset[p] + k * chunk) * elem, chunk_len(p, k) * elem,
                                p, kTagPairwise));
    }
    if (k < chunks_of(me)) {
      for (int p = 0; p < n; ++p) {
        if (p != me) t.Wait(recvs[p]);
      }
      if (k + 1 < chunks_of(me)) post_recvs(k + 1);
      const int64_t m = chunk_len(me, k);
      char* dst = mine + k * chunk * elem;
      const char* own = dst;
      if (me >= 2) {
        std::memcpy(own_copy, dst, m * elem);
        own = own_copy;
      }
      auto value = [&](int r) -> const char* { return r == me ? own : landing(r, k); };
      ReduceTo(dst, value(0), value(1), m, dtype, op);
      for (int r = 2; r < n; ++r) ReduceInto(dst, value(r), m, dtype, op);
    }
    for (auto h : sent) t.Wait(h);
  }
  for (auto h : sending) t.Wait(h);
  if (op == ReduceOp::kAverage) DivideBy(mine, counts[me], dtype, n);
}

void OrderedAllreduce(Transport& t, void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  if (t.size() == 1 || count == 0) return;
  const std::vector<int64_t> counts = EvenSegments(count, t.size());
  PairwiseReduceScatter(t, buffer, counts, dtype, op);
  RingAllgather(t, buffer, counts, dtype);
}

}  // namespace ddl
