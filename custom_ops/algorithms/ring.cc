#include "ring.h"

#include <algorithm>

#include "../common/reduce_kernels.h"
#include "../transport/tags.h"

namespace ddl {

namespace {

// Receive-side pipeline unit: a received chunk is reduced while the next one
// is in flight. 256 KB keeps the two scratch chunks and the destination in L2.
constexpr size_t kPipelineChunkBytes = 256 * 1024;
// Message size of the all-gather. Over TCP (MPICH with UCX) both ranks of a
// pair exchanging multi-MB messages took turns, one direction at a time
// (the 32 MB exchange of a 2-node 64 MB allreduce took 2x the link time in
// about half the runs); 512 KB messages, all posted at once, keep both
// directions busy.
constexpr size_t kAllgatherMessageBytes = 512 * 1024;

int Mod(int a, int n) { return ((a % n) + n) % n; }

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

// Sends `send_bytes` from `send` to `next` while receiving the same segment
// layout from `prev` and reducing it into `dest`, chunk by chunk.
void SendRecvReduce(Transport& t, const char* send, size_t send_bytes, int next, char* dest,
                    size_t recv_bytes, int prev, DataType dtype, ReduceOp op,
                    std::vector<char>& scratch) {
  const size_t elem = DataTypeSize(dtype);
  const size_t chunk = std::max(elem, std::min(kPipelineChunkBytes, t.MaxMessageBytes()) / elem * elem);
  scratch.resize(2 * chunk);
  // Both sides chunk their own segment; the segments differ in size by at
  // most one element, so the counts of chunks can differ by one.
  const size_t send_chunks = (send_bytes + chunk - 1) / chunk;
  const size_t recv_chunks = (recv_bytes + chunk - 1) / chunk;
  std::vector<Transport::Handle> sends;
  sends.reserve(send_chunks);
  for (size_t k = 0; k < send_chunks; ++k) {
    size_t n = std::min(chunk, send_bytes - k * chunk);
    sends.push_back(t.Isend(send + k * chunk, n, next, kTagReduceScatter));
  }
  auto recv_size = [&](size_t k) { return std::min(chunk, recv_bytes - k * chunk); };
  Transport::Handle pending = -1;
  if (recv_chunks > 0) pending = t.Irecv(scratch.data(), recv_size(0), prev, kTagReduceScatter);
  for (size_t k = 0; k < recv_chunks; ++k) {
    t.Wait(pending);
    char* landed = scratch.data() + (k % 2) * chunk;
    if (k + 1 < recv_chunks) {
      pending = t.Irecv(scratch.data() + ((k + 1) % 2) * chunk, recv_size(k + 1), prev,
                        kTagReduceScatter);
    }
    ReduceInto(dest + k * chunk, landed, static_cast<int64_t>(recv_size(k) / elem), dtype, op);
  }
  for (auto h : sends) t.Wait(h);
}

}  // namespace

std::vector<int64_t> EvenSegments(int64_t count, int n) {
  std::vector<int64_t> counts(n, count / n);
  for (int i = 0; i < count % n; ++i) counts[i] += 1;
  return counts;
}

void RingReduceScatter(Transport& t, void* buffer, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) {
  const int n = t.size();
  const int r = t.rank();
  const size_t elem = DataTypeSize(dtype);
  char* base = static_cast<char*>(buffer);
  const std::vector<int64_t> offsets = Offsets(counts);
  std::vector<char> scratch;
  // n-1 steps: at step s rank r forwards its partial sum of segment r-1-s and
  // folds in the partial of segment r-2-s from its left neighbour; segment j
  // starts at rank j+1 and has visited every rank when it arrives at rank j.
  for (int s = 0; s < n - 1; ++s) {
    int send_seg = Mod(r - 1 - s, n);
    int recv_seg = Mod(r - 2 - s, n);
    SendRecvReduce(t, base + offsets[send_seg] * elem, counts[send_seg] * elem, Mod(r + 1, n),
                   base + offsets[recv_seg] * elem, counts[recv_seg] * elem, Mod(r - 1, n), dtype,
                   op, scratch);
  }
  if (op == ReduceOp::kAverage && n > 1) {
    DivideBy(base + offsets[r] * elem, counts[r], dtype, n);
  }
}

void RingAllgather(Transport& t, void* buffer, const std::vector<int64_t>& counts,
                   DataType dtype) {
  const int n = t.size();
  const int r = t.rank();
  const size_t elem = DataTypeSize(dtype);
  char* base = static_cast<char*>(buffer);
  const std::vector<int64_t> offsets = Offsets(counts);
  const size_t max_bytes = std::max(elem, std::min(kAllgatherMessageBytes, t.MaxMessageBytes()) / elem * elem);
  // n-1 steps: at step s rank r passes on segment r-s (its own at s=0, then
  // the one it received in the previous step) and receives segment r-1-s.
  for (int s = 0; s < n - 1; ++s) {
    int send_seg = Mod(r - s, n);
    int recv_seg = Mod(r - 1 - s, n);
    std::vector<Transport::Handle> handles;
    for (int64_t done = 0; done < counts[recv_seg] * static_cast<int64_t>(elem);) {
      size_t bytes = std::min<size_t>(max_bytes, counts[recv_seg] * elem - done);
      handles.push_back(t.Irecv(base + offsets[recv_seg] * elem + done, bytes, Mod(r - 1, n),
                                kTagAllgather));
      done += bytes;
    }
    for (int64_t done = 0; done < counts[send_seg] * static_cast<int64_t>(elem);) {
      size_t bytes = std::min<size_t>(max_bytes, counts[send_seg] * elem - done);
      handles.push_back(t.Isend(base + offsets[send_seg] * elem + done, bytes, Mod(r + 1, n),
                                kTagAllgather));
      done += bytes;
    }
    for (auto h : handles) t.Wait(h);
  }
}

void RingAllreduce(Transport& t, void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  if (t.size() == 1 || count == 0) return;
  std::vector<int64_t> counts = EvenSegments(count, t.size());
  RingReduceScatter(t, buffer, counts, dtype, op);
  RingAllgather(t, buffer, counts, dtype);
}

}  // namespace ddl
