// Every rule that picks an allreduce, in one place. Two moments choose:
//
// - At start-up (engine/context.cc applies these to what the ranks
//   agreed): DDL_ALLREDUCE and the topology decide whether the racks are
//   used (the rack grid of algorithms/rack_allreduce.h), what the flat and
//   cross-node steps may assume of the network (NetworkShape), and whether
//   the node's ranks meet in shared memory (algorithms/node_allreduce.h).
// - Per call (the executor for the flat world, the node allreduce for its
//   cross-node step): ChooseAllreduce's size rule, or the algorithm the
//   autotuner (tuning/autotune.h) named for the call's size class.
//
// The rack grid's own choice between its exchange and its pipeline, and
// the pipeline's piece size, stay with it (RackGridAllreduce,
// RackSlicePieceBytes in algorithms/rack_allreduce.h): they need the grid.
//
// Nothing here moves bytes: the algorithms (algorithms/) run what these
// rules name, so a reader finds why an algorithm ran here and how it runs
// there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddl {

// DDL_ALLREDUCE. Read from the setting's word by name (AllreduceAlgorithmNamed).
enum class AllreduceAlgorithm { kAuto, kFlat, kHierarchical, kRacks };
// False for a word it does not know (settings.def lists one this file
// does not: a build error the start-up reports, never a silent default).
bool AllreduceAlgorithmNamed(const std::string& word, AllreduceAlgorithm* out);

// DDL_UPLINK_COMPRESSION: float16 on the rack grid's uplinks (stages B
// and C of algorithms/rack_allreduce.h) for float32 allreduces. kFp16:
// every such call; kAuto: a candidate of DDL_AUTOTUNE=1 (none without it).
enum class UplinkCompression { kNone, kFp16, kAuto };
bool UplinkCompressionNamed(const std::string& word, UplinkCompression* out);

// Which algorithm a job's network step runs, when someone (the autotuner,
// tuning/autotune.h) has chosen for it instead of the size rule. The flat
// world and the cross-node step take kDirectExchange, kPairwiseRing and
// kChain; the rack grid (algorithms/rack_allreduce.h) kRackExchange to
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

// What the job was told about the network a step runs over.
enum class NetworkShape : uint8_t {
  // Nothing (no DDL_TOPOLOGY, no Slurm topology): it may be racks behind
  // oversubscribed uplinks, listed rack by rack.
  kUnknown,
  // One switch: told so (DDL_TOPOLOGY=none, one rack from Slurm or a
  // hostfile), or the flat and hierarchical paths asked for by name.
  kOneSwitch,
};

// --- At start-up -----------------------------------------------------------

// Whether the rack grid runs the cross-node step: DDL_ALLREDUCE=racks or
// auto, with several racks of `even` nodes (as many nodes in every rack,
// as many ranks on every node). racks with uneven racks is refused before
// (context.cc names why).
bool UseRacks(AllreduceAlgorithm algorithm, bool even, int racks);
// What the flat and cross-node steps may assume: nobody described the
// network (`untold`), or described racks the rack grid cannot use, makes
// auto's large calls take the chain, whose flows per link do not grow with
// the nodes; anything asked for by name, or one switch, is kOneSwitch.
NetworkShape ShapeOfNetwork(AllreduceAlgorithm algorithm, bool racks_used, bool untold,
                            int racks);
// Whether the node's ranks allreduce in shared memory first: one node
// with several ranks (shared memory), several such nodes (hierarchical),
// the racks with several ranks per node; never flat, nor auto with uneven
// nodes. DDL_ALLREDUCE=hierarchical with uneven nodes is refused before.
bool UseNodeMemory(AllreduceAlgorithm algorithm, int local_size, bool homogeneous);

// --- Per call ----------------------------------------------------------------

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

// The flat algorithm a call of `bytes` per rank over `ranks` runs: the
// one `choice` names when it is kDirectExchange, kPairwiseRing or kChain,
// otherwise the size rule:
// - up to kDirectExchangeBytes sent per rank, the direct exchange;
// - over an unknown network, 3 or more ranks and kChainMinBytes or more,
//   the chain: its flows per link stay two however many ranks there are,
//   where the pairwise reduce-scatter's grow with them (chain_allreduce.h);
// - otherwise the pairwise reduce-scatter and ring all-gather.
// All three combine in rank order, so the choice never changes a result.
// algorithms/allreduce.h's FlatAlgorithm runs it.
NetworkChoice ChooseAllreduce(int ranks, size_t bytes,
                              NetworkChoice choice = NetworkChoice::kAuto,
                              NetworkShape shape = NetworkShape::kOneSwitch);

}  // namespace ddl
