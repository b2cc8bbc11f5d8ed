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
// as many, before its all-gather adds more). The stages of different
// pieces run at once, each piece moving to its next stage as soon as its
// round is done, up to kRackRoundsInFlight pieces per stage, so the node
// links and the uplinks are busy together (each with pieces queued) and a
// call takes about the slower of the two, not their sum.
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

// Bytes of a piece (the pipeline's unit) and pieces in flight per stage.
// Each stage moves a piece on as soon as its own round of it is done, so
// a slow message holds back only its piece; kRackRoundsInFlight pieces
// queued per stage keep the uplinks busy meanwhile. A call goes in pieces
// of 1 MiB (a smaller call is one piece): enough pieces to fill the
// pipeline, each message long enough to amortise its round trips over
// TCP, and the landing areas (about a piece per slot) small. On the test
// cluster (2 racks x 4 nodes, 1 Gbit/s links, 250 Mbit/s uplinks, 64 MB
// calls, 8 in flight) two launches alternating the piece size call by
// call gave, as medians of 6 and 8 calls: 1 MiB 0.879 and 0.899 of the
// bound, 2 MiB 0.866 and 0.859 (512 KiB 0.883, with a wider spread).
// The earlier schedule of whole steps in 8 MiB pieces ran at 0.83-0.85.
constexpr size_t kRackPieceBytes = 1 << 20;
constexpr int kRackRoundsInFlight = 8;
size_t RackPieceBytes(size_t call_bytes);
// With several ranks per node NodeAllreduce hands the rack allreduce one
// local rank's slice of a shared-memory chunk at a time: an eighth of the
// slice, within 64 KiB-2 MiB, keeps the four stages overlapped within the
// chunk (chunks of 4 MiB never reach the cap).
size_t RackSlicePieceBytes(size_t slice_bytes);

// In-place allreduce of `count` elements over the N x R grid described by
// `rack` (size N) and `across` (size R). Every rank of the grid calls it
// with the same count, dtype, op, piece_bytes and half_uplinks.
//
// `half_uplinks` (float32 buffers with R > 1; ignored otherwise): stages
// B and C, the only ones on the uplinks, send float16, halving the bytes
// there; A and D stay float32. Each rank rounds its rack's float32
// partial to float16 once before B (the owner its own part too, so every
// rack's value went through the same rounding); the owner widens the R
// values back and combines them in rack order in float32, divides once
// for Average, and rounds the result to float16; C gathers that, and
// every rank (the owner too) holds it as float32. Per element:
//   result = f16(((f16(r0) op f16(r1)) op f16(r2)) ... [/ (N x R)])
// with r the rack partials above: still the same bits on every rank and
// for every piece size, at the cost of two float16 roundings (a relative
// error up to 2^-11 each; values beyond 65504 become inf).
void RackAllreduce(Transport& rack, Transport& across, void* buffer, int64_t count,
                   DataType dtype, ReduceOp op, size_t piece_bytes = kRackPieceBytes,
                   bool half_uplinks = false);

// The groups of one rank of the N x R grid: `all` holds every rank of the
// grid in rack-major order (rank = rack x N + node), `rack` and `across`
// as above.
struct RackGrid {
  Transport* all;
  Transport* rack;
  Transport* across;
  // Every float32 call of this grid sends fp16 on the uplinks
  // (DDL_UPLINK_COMPRESSION=fp16): RackAllreduce's half_uplinks.
  bool half_uplinks = false;
};

// Up to this many bytes sent per rank (the buffer times the other ranks),
// one round of messages over `all` beats the four rounds of the schedule
// (as DirectExchangeAllreduce over one switch).
constexpr size_t kRackDirectExchangeBytes = 64 << 10;

// Every rank sends its buffer to every other over `all` and combines them
// in the same order as RackAllreduce, so a tensor gets the same bits
// whichever of the two its fused call took; with `half_uplinks` it sends
// float32 but rounds as RackAllreduce's half_uplinks does, for the same
// reason.
void RackOrderedExchange(Transport& all, int nodes_per_rack, void* buffer, int64_t count,
                         DataType dtype, ReduceOp op, bool half_uplinks = false);

// The allreduce of a job with racks: the one-round exchange for small
// calls, the pipelined schedule above for the rest, in pieces of
// `piece_bytes` (0: RackPieceBytes of the call). Returns the name of the
// one it ran (the timeline's phase; "_FP16UP" appended with fp16 on the
// uplinks). A `choice` of kRackExchange, kRackPipeline256K,
// kRackPipeline1M or kRackPipelineSized runs that one whatever the size
// (the pipelines with their own piece size instead of `piece_bytes`);
// kRackPipelineSizedFp16Up the sized one with fp16 uplinks for a float32
// buffer (plain for any other dtype); any other choice is the size rule.
// `grid.half_uplinks` applies to every float32 call, whatever the choice.
const char* RackGridAllreduce(const RackGrid& grid, void* buffer, int64_t count, DataType dtype,
                              ReduceOp op, size_t piece_bytes = 0,
                              NetworkChoice choice = NetworkChoice::kAuto);

}  // namespace ddl
