#include "alltoall.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "../transport/tags.h"

namespace ddl {

namespace {


// Bytes per message: big enough that per-message overhead is small, small
// enough that one chunk crosses a slow link well within the peer timeout.
constexpr size_t kChunkBytes = 512 * 1024;
// Chunks in flight per direction: keeps a network link busy across
// per-message round trips while bounding what a slow peer holds back.
constexpr size_t kWindow = 8;

std::vector<size_t> Offsets(const std::vector<size_t>& bytes) {
  std::vector<size_t> offset(bytes.size() + 1, 0);
  for (size_t r = 0; r < bytes.size(); ++r) offset[r + 1] = offset[r] + bytes[r];
  return offset;
}

// One step: `out` bytes to `to` while `in` bytes arrive from `from`, as
// chunks interleaved receive-first, at most 2 * kWindow messages in flight.
// Both ends cut a block at the same boundaries (same byte count, same
// chunk size), so chunk k of a send is exactly chunk k of its receive.
// Every rank posts its chunks in the same order, and a waited-for message
// only depends on messages posted before it, so the window cannot
// deadlock.
void Exchange(Transport& t, const char* out, size_t out_bytes, int to, char* in, size_t in_bytes,
              int from) {
  const size_t chunk = std::min(kChunkBytes, t.MaxMessageBytes());
  std::deque<Transport::Handle> in_flight;
  size_t sent = 0, received = 0;
  while (sent < out_bytes || received < in_bytes) {
    if (in_flight.size() + 2 > 2 * kWindow) {
      t.Wait(in_flight.front());
      in_flight.pop_front();
    }
    if (received < in_bytes) {
      const size_t n = std::min(chunk, in_bytes - received);
      in_flight.push_back(t.Irecv(in + received, n, from, kTagAlltoall));
      received += n;
    }
    if (sent < out_bytes) {
      const size_t n = std::min(chunk, out_bytes - sent);
      in_flight.push_back(t.Isend(out + sent, n, to, kTagAlltoall));
      sent += n;
    }
  }
  for (Transport::Handle h : in_flight) t.Wait(h);
}

}  // namespace

std::vector<int64_t> ExchangeCounts(Transport& t, const std::vector<int64_t>& to_each) {
  const int n = t.size();
  const int me = t.rank();
  std::vector<int64_t> from_each(n, 0);
  from_each[me] = to_each[me];
  // One small message to and from every peer: all receives first, so every
  // send finds its receive posted.
  std::vector<Transport::Handle> handles;
  for (int p = 0; p < n; ++p) {
    if (p != me) handles.push_back(t.Irecv(&from_each[p], sizeof(int64_t), p, kTagCounts));
  }
  for (int p = 0; p < n; ++p) {
    if (p != me) handles.push_back(t.Isend(&to_each[p], sizeof(int64_t), p, kTagCounts));
  }
  for (Transport::Handle h : handles) t.Wait(h);
  return from_each;
}

void PairwiseAlltoall(Transport& t, const void* send, const std::vector<size_t>& send_bytes,
                      void* recv, const std::vector<size_t>& recv_bytes) {
  const int n = t.size();
  const int me = t.rank();
  const char* out = static_cast<const char*>(send);
  char* in = static_cast<char*>(recv);
  const std::vector<size_t> out_at = Offsets(send_bytes);
  const std::vector<size_t> in_at = Offsets(recv_bytes);
  // This rank's own block is a local copy (step 0).
  if (send_bytes[me] > 0) std::memcpy(in + in_at[me], out + out_at[me], send_bytes[me]);
  // Steps 1 .. n-1 (step 0 was the copy): in step s every rank sends to
  // the rank s after it and receives from the rank s before it, so in each
  // step every rank has exactly one outgoing and one incoming block, and
  // rank `to` is receiving from this rank in the same step.
  for (int s = 1; s < n; ++s) {
    const int to = (me + s) % n;
    const int from = (me - s + n) % n;
    Exchange(t, out + out_at[to], send_bytes[to], to, in + in_at[from], recv_bytes[from], from);
  }
}

}  // namespace ddl
