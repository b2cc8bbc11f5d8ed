#include "allreduce.h"

#include <algorithm>
#include <cstring>

#include "../common/reduce_kernels.h"
#include "chain_allreduce.h"
#include "pairwise.h"
#include "../transport/tags.h"

namespace ddl {

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
      {"DIRECT_EXCHANGE_ALLREDUCE", NetworkChoice::kDirectExchange, DirectExchangeAllreduce},
      {"PAIRWISE_RING_ALLREDUCE", NetworkChoice::kPairwiseRing, OrderedAllreduce},
      {"CHAIN_ALLREDUCE", NetworkChoice::kChain, ChainAllreduceSized},
  };
  return list;
}

const TransportAllreduce& ChooseAllreduce(int ranks, size_t bytes, NetworkChoice choice,
                                          NetworkShape shape) {
  const std::vector<TransportAllreduce>& list = AllreduceAlgorithms();
  for (const TransportAllreduce& a : list) {
    if (choice != NetworkChoice::kAuto && a.choice == choice) return a;
  }
  // kAuto, or a choice that belongs to another step: the size rule.
  const auto named = [&](NetworkChoice c) -> const TransportAllreduce& {
    return *std::find_if(list.begin(), list.end(),
                         [c](const TransportAllreduce& a) { return a.choice == c; });
  };
  if (static_cast<size_t>(ranks - 1) * bytes <= kDirectExchangeBytes) {
    return named(NetworkChoice::kDirectExchange);
  }
  if (shape == NetworkShape::kUnknown && ranks >= 3 && bytes >= kChainMinBytes) {
    return named(NetworkChoice::kChain);
  }
  return named(NetworkChoice::kPairwiseRing);
}

}  // namespace ddl
