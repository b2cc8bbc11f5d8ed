// The allreduce algorithms over one transport (the flat world, or the
// cross-node step of the hierarchical allreduce). The rule that picks one
// per call is ChooseAllreduce (topology/choose_allreduce.h).
//
// All of them give the same bits: every element is combined in rank order,
// ((x0 op x1) op x2) op ..., and divided once for Average, by whichever
// rank holds it. So which algorithm runs, like how tensors were fused,
// never changes a result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/types.h"
#include "../topology/choose_allreduce.h"
#include "../transport/transport.h"

namespace ddl {

struct TransportAllreduce {
  const char* name;  // also the timeline phase of a call that used it
  NetworkChoice choice;  // what names it (topology/choose_allreduce.h)
  // In-place allreduce of `count` elements (Average divides by the ranks).
  void (*run)(Transport& transport, void* buffer, int64_t count, DataType dtype, ReduceOp op);
};

// Every flat allreduce: the direct exchange, the pairwise reduce-scatter
// with the ring all-gather, the chain.
const std::vector<TransportAllreduce>& AllreduceAlgorithms();

// The flat algorithm `choice` names: ChooseAllreduce's answer
// (topology/choose_allreduce.h), kDirectExchange, kPairwiseRing or kChain.
const TransportAllreduce& FlatAlgorithm(NetworkChoice choice);

// One round: every rank's `bytes` of `buffer` land in parts + r x bytes
// (this rank's own copied there), sent in pieces of whole `element`s of at
// most the transport's largest message, with `tag`. Returns once every
// piece has arrived and been sent (so `buffer` may change again). The
// direct exchange's round, and the rack grid's ordered exchange's.
void ExchangeBuffers(Transport& transport, const void* buffer, size_t bytes, size_t element,
                     char* parts, int tag);

// Every rank sends its whole buffer to every other and combines all of
// them: one round of messages, (ranks - 1) x the buffer sent per rank.
void DirectExchangeAllreduce(Transport& transport, void* buffer, int64_t count, DataType dtype,
                             ReduceOp op);

}  // namespace ddl
