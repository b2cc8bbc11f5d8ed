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

// Which algorithm a job's network step runs, when someone (the autotuner,
// tuning/autotune.h) has chosen for it instead of the size rule. The flat
// world and the cross-node step take kDirectExchange, kPairwiseRing and
// kChain; the rack grid (rack_allreduce.h) kRackExchange to
// kRackPipelineSizedFp16Up. A choice that does not belong to the step
// being run means kAuto there. Every rank of a call must pass the same
// choice: the algorithms send different messages.
enum class NetworkChoice : uint8_t {
  kAuto = 0,         // the size rule (ChooseAllreduce, RackGridAllreduce)
  kDirectExchange,   // DirectExchangeAllreduce
  kPairwiseRing,     // OrderedAllreduce: pairwise reduce-scatter, ring all-gather
  kRackExchange,     // RackOrderedExchange
  kRackPipeline256K, // RackAllreduce in pieces of 256 KiB
  kRackPipeline1M,   // RackAllreduce in pieces of 1 MiB
  kRackPipelineSized,  // RackAllreduce in the size rule's pieces (rack_allreduce.h)
  kRackPipelineSizedFp16Up,  // the same with fp16 on the uplinks (float32 buffers)
  kChain,            // ChainAllreduce (chain_allreduce.h) in the size rule's pieces
};

struct TransportAllreduce {
  const char* name;  // also the timeline phase of a call that used it
  NetworkChoice choice;  // what names it to ChooseAllreduce
  // In-place allreduce of `count` elements (Average divides by the ranks).
  void (*run)(Transport& transport, void* buffer, int64_t count, DataType dtype, ReduceOp op);
};

// Every flat allreduce: the direct exchange, the pairwise reduce-scatter
// with the ring all-gather, the chain.
const std::vector<TransportAllreduce>& AllreduceAlgorithms();

// What the job was told about the network a step runs over.
enum class NetworkShape : uint8_t {
  // Nothing (no DDL_TOPOLOGY, no Slurm topology): it may be racks behind
  // oversubscribed uplinks, listed rack by rack.
  kUnknown,
  // One switch: told so (DDL_TOPOLOGY=none, one rack from Slurm or a
  // hostfile), or the flat and hierarchical paths asked for by name.
  kOneSwitch,
};

// Up to this many bytes sent per rank, one round of messages beats the
// pairwise reduce-scatter and ring all-gather (ranks rounds): over TCP a
// round costs tens of microseconds, 64 KB at 10 Gbit/s about fifty. With
// two ranks both send the same bytes; the ring's second round is saved
// (2 nodes at 1 Gbit/s: 4-16 KB calls 15-25% faster, equal at 64 KB).
constexpr size_t kDirectExchangeBytes = 64 << 10;
// From this many bytes per rank, a call over an unknown network of 3 or
// more ranks takes the chain (see ChooseAllreduce). On the test cluster
// (8 nodes, 1 Gbit/s; one launch, 5 calls per size), the chain's speed
// over the pairwise ring's: 2 racks behind 250 Mbit/s uplinks 0.6-0.9x
// from 32 to 128 KB, 1.45x at 256 KB, 1.8x at 512 KB; behind 1 Gbit/s
// uplinks 0.87x at 256 KB, 1.03x at 512 KB, 1.3x at 1 MB; one switch
// 0.7-0.9x at every size (it sends more per node there, chain_allreduce.h).
constexpr size_t kChainMinBytes = 256 << 10;

// The size rule, or the algorithm `choice` names whatever the size:
// - up to kDirectExchangeBytes sent per rank, the direct exchange;
// - over an unknown network, 3 or more ranks and kChainMinBytes or more,
//   the chain: its flows per link stay two however many ranks there are,
//   where the pairwise reduce-scatter's grow with them (chain_allreduce.h);
// - otherwise the pairwise reduce-scatter and ring all-gather.
// All three combine in rank order, so the choice never changes a result.
const TransportAllreduce& ChooseAllreduce(int ranks, size_t bytes,
                                          NetworkChoice choice = NetworkChoice::kAuto,
                                          NetworkShape shape = NetworkShape::kOneSwitch);

// Every rank sends its whole buffer to every other and combines all of
// them: one round of messages, (ranks - 1) x the buffer sent per rank.
void DirectExchangeAllreduce(Transport& transport, void* buffer, int64_t count, DataType dtype,
                             ReduceOp op);

}  // namespace ddl
