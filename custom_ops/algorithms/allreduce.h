// The allreduce algorithms over one transport (the flat world, or the
// cross-node step of the hierarchical allreduce) and the rule that picks
// one per call.
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
#include "../transport/transport.h"

namespace ddl {

struct TransportAllreduce {
  const char* name;  // also the timeline phase of a call that used it
  // True if it is a good choice for `bytes` per rank over `ranks` ranks.
  bool (*suits)(int ranks, size_t bytes);
  // In-place allreduce of `count` elements (Average divides by the ranks).
  void (*run)(Transport& transport, void* buffer, int64_t count, DataType dtype, ReduceOp op);
};

// In order of preference; the last one suits every call.
const std::vector<TransportAllreduce>& AllreduceAlgorithms();

// Which algorithm a job's network step runs, when someone (the autotuner,
// engine/autotune.h) has chosen for it instead of the size rule. The flat
// world and the cross-node step take the first two; the rack grid
// (rack_allreduce.h) the last five. A choice that does not belong to the
// step being run means kAuto there. Every rank of a call must pass the
// same choice: the algorithms send different messages.
enum class NetworkChoice : uint8_t {
  kAuto = 0,         // the size rule (ChooseAllreduce, RackGridAllreduce)
  kDirectExchange,   // DirectExchangeAllreduce
  kPairwiseRing,     // OrderedAllreduce: pairwise reduce-scatter, ring all-gather
  kRackExchange,     // RackOrderedExchange
  kRackPipeline256K, // RackAllreduce in pieces of 256 KiB
  kRackPipeline1M,   // RackAllreduce in pieces of 1 MiB
  kRackPipelineSized,  // RackAllreduce in the size rule's pieces (rack_allreduce.h)
  kRackPipelineSizedFp16Up,  // the same with fp16 on the uplinks (float32 buffers)
};

// The first algorithm of the list that suits the call; with a choice of
// kDirectExchange or kPairwiseRing, that algorithm whatever the size.
const TransportAllreduce& ChooseAllreduce(int ranks, size_t bytes,
                                          NetworkChoice choice = NetworkChoice::kAuto);

// Every rank sends its whole buffer to every other and combines all of
// them: one round of messages, (ranks - 1) x the buffer sent per rank.
void DirectExchangeAllreduce(Transport& transport, void* buffer, int64_t count, DataType dtype,
                             ReduceOp op);

}  // namespace ddl
