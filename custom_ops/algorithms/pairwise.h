// Reduce-scatter by direct exchange: every rank sends segment p of its
// buffer straight to rank p and sums what it receives for its own segment
// in rank order, ((x0 op x1) op x2) op ... Each rank sends and receives
// (n-1)/n of the buffer, as in a ring, in one step instead of n-1; and an
// element's result no longer depends on which segment it falls in, so the
// same tensors give the same bits however they were fused. The allreduces
// across nodes and the flat one use it for that reason.
#pragma once

#include <cstdint>
#include <vector>

#include "../common/types.h"
#include "../transport/transport.h"

namespace ddl {

// Same contract as RingReduceScatter: afterwards segment r of `buffer` on
// rank r holds the reduction over all ranks (divided by n for Average);
// other segments are left as they were. `segment_counts` identical on
// every rank.
void PairwiseReduceScatter(Transport& transport, void* buffer,
                           const std::vector<int64_t>& segment_counts, DataType dtype,
                           ReduceOp op);

// In-place allreduce of `count` elements: PairwiseReduceScatter, then the
// ring all-gather.
void OrderedAllreduce(Transport& transport, void* buffer, int64_t count, DataType dtype,
                      ReduceOp op);

}  // namespace ddl
