#include "allreduce.h"

#include <algorithm>
#include <cstring>

#include "../common/reduce_kernels.h"
#include "pairwise.h"
#include "../transport/tags.h"

namespace ddl {

namespace {


// Up to this many bytes sent per rank, one round of messages beats the
// pairwise reduce-scatter and ring all-gather (ranks rounds): over TCP a
// round costs tens of microseconds, 64 KB at 10 Gbit/s about fifty. With
// two ranks both send the same bytes; the ring's second round is saved
// (2 nodes at 1 Gbit/s: 4-16 KB calls 15-25% faster, equal at 64 KB).
constexpr size_t kDirectExchangeBytes = 64 << 10;

bool DirectExchangeSuits(int ranks, size_t bytes) {
  return static_cast<size_t>(ranks - 1) * bytes <= kDirectExchangeBytes;
}

bool AlwaysSuits(int, size_t) { return true; }

}  // namespace

void DirectExchangeAllreduce(Transport& t, void* buffer, int64_t count, DataType dtype,
                             ReduceOp op) {
  const int n = t.size();
  const int me = t.rank();
  if (n == 1 || count == 0) return;
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  // Rank r's buffer lands in part r; this rank's own part is a copy, since
  // `buffer` is read by the sends until they complete.
  std::vector<char> parts(static_cast<size_t>(n) * bytes);
  auto part = [&](int r) { return parts.data() + static_cast<size_t>(r) * bytes; };
  // Pieces of at most MaxMessageBytes, whole elements each; the calls this
  // algorithm suits fit in one, so the loop normally runs once.
  const size_t element = DataTypeSize(dtype);
  const size_t piece = std::max(element, t.MaxMessageBytes() / element * element);
  std::vector<Transport::Handle> handles;
  for (size_t offset = 0; offset < bytes; offset += piece) {
    const size_t n_bytes = std::min(piece, bytes - offset);
    for (int p = 0; p < n; ++p) {
      if (p != me) handles.push_back(t.Irecv(part(p) + offset, n_bytes, p, kTagDirect));
    }
    for (int p = 0; p < n; ++p) {
      if (p != me) {
        handles.push_back(t.Isend(static_cast<const char*>(buffer) + offset, n_bytes, p, kTagDirect));
      }
    }
  }
  std::memcpy(part(me), buffer, bytes);
  for (Transport::Handle h : handles) t.Wait(h);
  ReduceTo(buffer, part(0), part(1), count, dtype, op);
  for (int r = 2; r < n; ++r) ReduceInto(buffer, part(r), count, dtype, op);
  if (op == ReduceOp::kAverage) DivideBy(buffer, count, dtype, n);
}

const std::vector<TransportAllreduce>& AllreduceAlgorithms() {
  static const std::vector<TransportAllreduce> list = {
      {"DIRECT_EXCHANGE_ALLREDUCE", DirectExchangeSuits, DirectExchangeAllreduce},
      {"PAIRWISE_RING_ALLREDUCE", AlwaysSuits, OrderedAllreduce},
  };
  return list;
}

const TransportAllreduce& ChooseAllreduce(int ranks, size_t bytes, NetworkChoice choice) {
  // The list's order: direct exchange first, pairwise + ring last.
  if (choice == NetworkChoice::kDirectExchange) return AllreduceAlgorithms().front();
  if (choice == NetworkChoice::kPairwiseRing) return AllreduceAlgorithms().back();
  for (const TransportAllreduce& a : AllreduceAlgorithms()) {
    if (a.suits(ranks, bytes)) return a;
  }
  return AllreduceAlgorithms().back();
}

}  // namespace ddl
