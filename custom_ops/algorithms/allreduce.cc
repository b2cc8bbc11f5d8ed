#include "allreduce.h"

#include <algorithm>
#include <cstring>

#include "../common/reduce_kernels.h"
#include "chain_allreduce.h"
#include "pairwise.h"
#include "../transport/tags.h"

namespace ddl {

void ExchangeBuffers(Transport& t, const void* buffer, size_t bytes, size_t element, char* parts,
                     int tag) {
  const int n = t.size();
  const int me = t.rank();
  auto part = [&](int r) { return parts + static_cast<size_t>(r) * bytes; };
  // Pieces of at most MaxMessageBytes, whole elements each.
  const size_t piece = std::max(element, t.MaxMessageBytes() / element * element);
  std::vector<Transport::Handle> handles;
  for (size_t offset = 0; offset < bytes; offset += piece) {
    const size_t n_bytes = std::min(piece, bytes - offset);
    for (int p = 0; p < n; ++p) {
      if (p != me) handles.push_back(t.Irecv(part(p) + offset, n_bytes, p, tag));
    }
    for (int p = 0; p < n; ++p) {
      if (p != me) {
        handles.push_back(t.Isend(static_cast<const char*>(buffer) + offset, n_bytes, p, tag));
      }
    }
  }
  std::memcpy(part(me), buffer, bytes);
  for (Transport::Handle h : handles) t.Wait(h);
}

void DirectExchangeAllreduce(Transport& t, void* buffer, int64_t count, DataType dtype,
                             ReduceOp op) {
  const int n = t.size();
  if (n == 1 || count == 0) return;
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  // Rank r's buffer lands in part r; this rank's own part is a copy, since
  // `buffer` is read by the sends until they complete.
  std::vector<char> parts(static_cast<size_t>(n) * bytes);
  auto part = [&](int r) { return parts.data() + static_cast<size_t>(r) * bytes; };
  // The calls this algorithm suits fit in one message per peer.
  ExchangeBuffers(t, buffer, bytes, DataTypeSize(dtype), parts.data(), kTagDirect);
  ReduceTo(buffer, part(0), part(1), count, dtype, op);
  for (int r = 2; r < n; ++r) ReduceInto(buffer, part(r), count, dtype, op);
  if (op == ReduceOp::kAverage) DivideBy(buffer, count, dtype, n);
}

const std::vector<TransportAllreduce>& AllreduceAlgorithms() {
  static const std::vector<TransportAllreduce> list = {
      {"DIRECT_EXCHANGE_ALLREDUCE", NetworkChoice::kDirectExchange, DirectExchangeAllreduce},
      {"PAIRWISE_RING_ALLREDUCE", NetworkChoice::kPairwiseRing, OrderedAllreduce},
      {"CHAIN_ALLREDUCE", NetworkChoice::kChain, ChainAllreduceSized},
  };
  return list;
}

const TransportAllreduce& FlatAlgorithm(NetworkChoice choice) {
  const std::vector<TransportAllreduce>& list = AllreduceAlgorithms();
  for (const TransportAllreduce& a : list) {
    if (a.choice == choice) return a;
  }
  return list[1];  // not a flat algorithm's choice: the pairwise ring, as the size rule would
}

}  // namespace ddl
