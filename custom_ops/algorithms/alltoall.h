// All-to-all by pairwise exchange: in step s (1 <= s < n) every rank sends
// its block for rank me+s and receives the block of rank me-s, so each step
// is a set of disjoint pairs (a permutation) and no link carries two
// blocks at once. Blocks move as bounded chunks with a few in flight: a
// slow link completes a chunk every so often (progress for the transport's
// timeout), and a large block is never queued whole behind one message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../transport/transport.h"

namespace ddl {

// Sends to_each[r] to rank r and returns what every rank sent to this
// one (entry r from rank r; this rank's own entry is to_each[me]). Used to
// tell receivers how many rows to expect before any data moves.
std::vector<int64_t> ExchangeCounts(Transport& transport, const std::vector<int64_t>& to_each);

// `send` holds one block per rank in rank order (send_bytes[r] bytes for
// rank r); afterwards `recv` holds the block from every rank in rank order
// (recv_bytes[r] bytes from rank r). recv_bytes[p] on this rank must equal
// send_bytes[me] on rank p (ExchangeCounts gives that). `send` and `recv`
// must not overlap.
void PairwiseAlltoall(Transport& transport, const void* send, const std::vector<size_t>& send_bytes,
                      void* recv, const std::vector<size_t>& recv_bytes);

}  // namespace ddl
