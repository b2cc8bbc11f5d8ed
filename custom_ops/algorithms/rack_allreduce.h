// The multi-dimensional allreduce across racks (PowerAI DDL's X x Y x Z,
// less the node dimension, which NodeAllreduce handles in shared memory).
//
// The ranks taking part form an N x R grid: N nodes per rack, R racks.
// `rack` is the group of this rank's row (the N ranks of its rack, in
// node order) and `across` its column (the R ranks that hold the same
// position in every rack, in rack order). Each piece of the buffer goes
// through four stages, each one round of direct messages:
//
//   A  reduce-scatter inside the rack: node i ends with segment i of the
//      piece summed over its rack (node links only);
//   B  reduce-scatter across racks of that segment: rack j's node ends with
//      sub-segment j summed over every rack (the only bytes on the uplinks);
//   C  all-gather of the sub-segments across racks;
//   D  all-gather of the segments inside the rack.
//
// Per node, A + D move 2(N-1)/N of the bytes over the node link and B + C
// another 2(R-1)/R of 1/N of them, 2(K-1)/K in all for K = N x R nodes,
// as in any bandwidth-optimal allreduce; per rack, B + C move 2(R-1)/R of
// the bytes over the uplink. A flat pairwise reduce-scatter over the K
// nodes alone sends N(K-N)/K of them over each uplink (2 racks of 4:
// as many, before its all-gather adds more). The stages of consecutive
// pieces run at once: in step i piece i enters A while pieces i-1, i-2 and
// i-3 move on to B, C and D, and up to two pieces are in flight in each
// stage, so the node links and the uplinks are busy together (each with
// the next piece queued) and a call takes about the slower of the two,
// not their sum.
//
// Summation order is fixed per element: the values of a rack in node
// order, then the racks in rack order, ((r0 op r1) op r2) ..., each
// r = ((n0 op n1) op n2) ...; one rank divides for Average (by N x R).
// Which piece or segment an element falls in never changes its result,
// so results do not depend on fusion or on the piece size, and every rank
// gets the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../common/types.h"
#include "../transport/transport.h"
#include "allreduce.h"

namespace ddl {

// Bytes of a piece (the pipeline's unit): large enough that each step's
// messages amortise their round trips over TCP, small enough that the
// pipeline's fill and drain (three steps) cost little of a large call.
// A call takes an eighth of its bytes, within these bounds. The upper one
// matters behind a slow uplink: a step ends with its slowest message, and
// the N flows sharing an uplink even out only over long messages (each is
// piece / (N x R) bytes). On the test cluster (2 racks x 4 nodes, 1 Gbit/s
// links, 250 Mbit/s uplinks, 64 MB calls), 1 MB pieces ran at 0.70 of the
// bound, 4 MB at 0.77, 8 MB at 0.86 and 16 MB at 0.73 (too few pieces to
// fill the pipeline).
constexpr size_t kRackPieceBytes = 1 << 20;
constexpr size_t kRackMaxPieceBytes = 8 << 20;
size_t RackPieceBytes(size_t call_bytes);

// In-place allreduce of `count` elements over the N x R grid described by
// `rack` (size N) and `across` (size R). Every rank of the grid calls it
// with the same count, dtype, op and piece_bytes.
void RackAllreduce(Transport& rack, Transport& across, void* buffer, int64_t count,
                   DataType dtype, ReduceOp op, size_t piece_bytes = kRackPieceBytes);

// The groups of one rank of the N x R grid: `all` holds every rank of the
// grid in rack-major order (rank = rack x N + node), `rack` and `across`
// as above.
struct RackGrid {
  Transport* all;
  Transport* rack;
  Transport* across;
};

// Up to this many bytes sent per rank (the buffer times the other ranks),
// one round of messages over `all` beats the four rounds of the schedule
// (as DirectExchangeAllreduce over one switch).
constexpr size_t kRackDirectExchangeBytes = 64 << 10;

// Every rank sends its buffer to every other over `all` and combines them
// in the same order as RackAllreduce, so a tensor gets the same bits
// whichever of the two its fused call took.
void RackOrderedExchange(Transport& all, int nodes_per_rack, void* buffer, int64_t count,
                         DataType dtype, ReduceOp op);

// The allreduce of a job with racks: the one-round exchange for small
// calls, the pipelined schedule above for the rest, in pieces of
// `piece_bytes` (0: RackPieceBytes of the call). Returns the name of the
// one it ran (the timeline's phase). A `choice` of kRackExchange,
// kRackPipeline256K, kRackPipeline1M or kRackPipelineEighth runs that one
// whatever the size (the pipelines with their own piece size instead of
// `piece_bytes`); any other choice is the size rule.
const char* RackGridAllreduce(const RackGrid& grid, void* buffer, int64_t count, DataType dtype,
                              ReduceOp op, size_t piece_bytes = 0,
                              NetworkChoice choice = NetworkChoice::kAuto);

}  // namespace ddl
