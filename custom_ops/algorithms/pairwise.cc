#include "pairwise.h"

#include <algorithm>
#include <cstring>

#include "../common/reduce_kernels.h"
#include "ring.h"
#include "../transport/tags.h"

namespace ddl {

namespace {


// Chunks in flight per peer. Over a network a message only moves once its
// receive is posted, so a deep window keeps the link busy across the
// per-message round trips; in shared memory it costs nothing.
constexpr int kWindow = 8;

// Elements per message: the window's scratch stays near 32 MB whatever the
// number of peers, without going below what keeps per-message overhead
// small or above what one step should hold back.
// Never above the transport's largest message.
int64_t ChunkElems(int n, size_t elem, size_t max_message_bytes) {
  const size_t budget = (size_t(32) << 20) / (kWindow * static_cast<size_t>(n - 1));
  const size_t bytes = std::min(std::clamp<size_t>(budget, 16 << 10, 512 << 10), max_message_bytes);
  return static_cast<int64_t>(std::max<size_t>(1, bytes / elem));
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
  const int64_t chunk = ChunkElems(n, elem, t.MaxMessageBytes());
  auto chunks_of = [&](int r) { return (counts[r] + chunk - 1) / chunk; };
  auto chunk_len = [&](int r, int64_t k) { return std::min(chunk, counts[r] - k * chunk); };
  int64_t steps = 0;
  for (int r = 0; r < n; ++r) steps = std::max(steps, chunks_of(r));

  // kWindow landing areas per peer (chunk k lands in area k % kWindow),
  // plus a copy of this rank's own chunk when it is not among the first
  // two summands.
  const size_t area = static_cast<size_t>(chunk) * elem;
  const int64_t mine_chunks = (counts[me] + chunk - 1) / chunk;
  const int window = static_cast<int>(std::min<int64_t>(kWindow, std::max<int64_t>(mine_chunks, 1)));
  std::vector<char> scratch((static_cast<size_t>(window) * (n - 1) + 1) * area);
  auto landing = [&](int peer, int64_t k) {
    const int index = peer < me ? peer : peer - 1;
    return scratch.data() + (static_cast<size_t>(k % window) * (n - 1) + index) * area;
  };
  char* own_copy = scratch.data() + static_cast<size_t>(window) * (n - 1) * area;
  char* const mine = base + offset[me] * elem;

  // recvs[k % window][p]: chunk k from peer p.
  std::vector<std::vector<Transport::Handle>> recvs(window, std::vector<Transport::Handle>(n, -1));
  auto post_recvs = [&](int64_t k) {
    for (int p = 0; p < n; ++p) {
      if (p != me) {
        recvs[k % window][p] = t.Irecv(landing(p, k), chunk_len(me, k) * elem, p, kTagPairwise);
      }
    }
  };
  // Sends of the last `window` chunks stay in flight; older ones are
  // waited for, so a slow peer never has the whole buffer queued.
  std::vector<std::vector<Transport::Handle>> sends(window);
  for (int64_t k = 0; k < std::min<int64_t>(window, mine_chunks); ++k) post_recvs(k);
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<Transport::Handle>& slot = sends[k % window];
    for (auto h : slot) t.Wait(h);
    slot.clear();
    for (int p = 0; p < n; ++p) {
      if (p == me || k >= chunks_of(p)) continue;
      slot.push_back(t.Isend(base + (offset[p] + k * chunk) * elem, chunk_len(p, k) * elem, p,
                             kTagPairwise));
    }
    if (k < mine_chunks) {
      for (int p = 0; p < n; ++p) {
        if (p != me) t.Wait(recvs[k % window][p]);
      }
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
      // Its landing areas are free again: post the chunk `window` ahead.
      if (k + window < mine_chunks) post_recvs(k + window);
    }
  }
  for (auto& slot : sends) {
    for (auto h : slot) t.Wait(h);
  }
  if (op == ReduceOp::kAverage) DivideBy(mine, counts[me], dtype, n);
}

void OrderedAllreduce(Transport& t, void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  if (t.size() == 1 || count == 0) return;
  const std::vector<int64_t> counts = EvenSegments(count, t.size());
  PairwiseReduceScatter(t, buffer, counts, dtype, op);
  RingAllgather(t, buffer, counts, dtype);
}

}  // namespace ddl
