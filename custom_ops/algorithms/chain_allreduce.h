// The chain allreduce: the schedule for a network nobody described.
//
// Partial sums flow up the chain of ranks in rank order, 0 -> 1 -> ... ->
// n-1, piece by piece: rank 0 sends its piece, rank i adds its own values
// to the partial it received and passes it on, and rank n-1 finishes the
// piece (divides it once for Average) and sends it back down,
// n-1 -> ... -> 0, each rank keeping a copy and passing it on. Pieces
// follow each other, so every link carries pieces both ways at once.
//
// Why this order and these links:
// - Every element is combined in rank order, ((x0 op x1) op x2) op ...,
//   by the same ranks whatever piece it falls in, and one rank makes the
//   result that all copy: the same bits on every rank, and the same bits
//   as the direct exchange and the pairwise reduce-scatter give (the flat
//   allreduces, allreduce.h), so a tensor's result depends neither on
//   fusion, nor on the piece size, nor on which algorithm a call took.
// - A rank talks to its two neighbours only, so each link carries two
//   flows whatever the number of ranks. Schedulers and hostfiles list
//   hosts rack by rack, so a chain over R racks crosses each uplink with
//   one flow each way (two for the racks in the middle), carrying the
//   buffer once each way: at two racks the least any allreduce must send
//   across. An all-pairs reduce-scatter instead sends N(K-N)/K of the
//   buffer across each uplink (K nodes, N per rack), growing with K.
// - The price: a rank in the middle sends and receives the buffer twice
//   (its partial up, the result down), where a ring sends 2(n-1)/n of it.
//   On a network that is truly one non-blocking switch the chain takes
//   n/(n-1) of the ring's time (1.33 at 4 ranks, 1.14 at 8); with two
//   ranks both send the buffer once. A rank-order fold cannot do better
//   with neighbours only: each rank in the middle must receive every
//   element's partial sum of the ranks before it and every result.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../common/types.h"
#include "../transport/transport.h"

namespace ddl {

// Pieces in flight per direction: each rank keeps this many partials
// posted for receiving and this many of its own partials in sending, so
// both directions of every link have pieces queued.
constexpr int kChainPiecesInFlight = 8;

// The piece size of a call of `call_bytes` over `ranks` ranks: pieces
// enter the chain one after another and the first result reaches rank 0
// after about 2(ranks - 1) hops, so the call is cut into about 8 pieces
// per hop of the chain (the fill and drain then cost about an eighth of
// the call), within 64 KiB (a message's fixed cost over TCP stays small)
// and 1 MiB (as the rack allreduce's pieces); a smaller call is one piece.
size_t ChainPieceBytes(size_t call_bytes, int ranks);

// In-place allreduce of `count` elements over `transport` in pieces of
// `piece_bytes` (0: ChainPieceBytes of the call); Average divides once,
// by the transport's size. Every rank passes the same count, dtype, op
// and piece_bytes.
void ChainAllreduce(Transport& transport, void* buffer, int64_t count, DataType dtype,
                    ReduceOp op, size_t piece_bytes = 0);

// ChainAllreduce with ChainPieceBytes' pieces (the allreduce list's entry).
void ChainAllreduceSized(Transport& transport, void* buffer, int64_t count, DataType dtype,
                         ReduceOp op);

}  // namespace ddl
