// Every rule that picks an allreduce, in one place. Two moments choose:
//
// - At start-up (engine/context.cc applies these to what the ranks
//   agreed): DDL_ALLREDUCE and the topology decide whether the racks are
//   used (the rack grid of algorithms/rack_allreduce.h), what the flat and
//   cross-node steps may assume of the network (NetworkShape), and whether
//   the node's ranks meet in shared memory (algorithms/node_allreduce.h).
// - Per call (the executor for the flat world, the node allreduce for its
//   cross-node step): ChooseAllreduce's size rule, or the algorithm the
//   autotuner (tuning/autotune.h) named for the call's size class; and
//   ChooseSinglePass, whether the node allreduce runs a call as its
//   single pass (through the executor, NodeAllreduce::FitsSmall).
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
  // The node allreduce's single pass across nodes (NodeAllreduce::RunSmall):
  // the node's sum in shared memory, one exchange between the nodes'
  // local rank 0s, the result shared. The cross-node step's choice.
  kNodeLeader,
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

// Up to this many bytes on one node the node allreduce takes its single
// pass (NodeAllreduce::RunSmall): one wait instead of the general path's
// two (three with the result pool), for a combining pass over n slots
// instead of one slice. Above it the split work wins as the bytes grow;
// 32 KB is inside the smallest slot (64 KB) and above the 4 KB calls the
// single pass was measured on (docs/performance-notes/2026-12-07-small-calls.md).
constexpr size_t kSinglePassOnNodeBytes = 32 << 10;
// Up to this many bytes across nodes, the single pass too: local rank 0
// sums the node's slots, exchanges the sum with the other nodes' rank 0s
// and leaves the result in its slot for the node. The general path meets
// the node's ranks twice and sends every local rank's slice over the
// network, each a round whose wake-ups cost more than the bytes when the
// calls are small (docs/performance-notes/2026-12-07-small-across-nodes.md).
// Past it the slices spread the reduction and the sends over the node's
// ranks; the autotuner may move the crossover (kNodeLeader, up to a slot).
constexpr size_t kSinglePassAcrossBytes = 64 << 10;

// Whether the node allreduce runs a call of `bytes` as its single pass.
// `across`: the call has a cross-node step; `slot_bytes`: the arena's
// slot, which must hold the whole call. Across nodes, `choice` kNodeLeader
// takes it up to a slot and any other named choice (the autotuner timing
// the general path) never; kAuto is the size rule above. The same on
// every local rank of every node (all pass the same values).
bool ChooseSinglePass(bool across, size_t bytes, size_t slot_bytes,
                      NetworkChoice choice = NetworkChoice::kAuto);

}  // namespace ddl
