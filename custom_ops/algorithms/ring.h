// Bandwidth-optimal ring collectives over any Transport (Patarasuk & Yuan,
// 2009): reduce-scatter then all-gather, each rank sending 2*(n-1)/n of the
// buffer. Every element of the result is reduced by exactly one rank and then
// copied, so all ranks end with bitwise-identical values whatever the dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "../common/types.h"
#include "../transport/transport.h"

namespace ddl {

// Element counts of the n contiguous segments that split `count` elements
// as evenly as possible (the first count % n segments get one more).
std::vector<int64_t> EvenSegments(int64_t count, int n);

// After the call, segment r of `buffer` on rank r holds the reduction over all
// ranks of that segment (divided by n for Average). Other segments are
// scratch. `segment_counts` must be identical on every rank.
void RingReduceScatter(Transport& transport, void* buffer,
                       const std::vector<int64_t>& segment_counts, DataType dtype, ReduceOp op);

// Before the call rank r owns segment r; after it every rank holds all.
void RingAllgather(Transport& transport, void* buffer,
                   const std::vector<int64_t>& segment_counts, DataType dtype);

// In-place allreduce of `count` elements (Average divides by n).
void RingAllreduce(Transport& transport, void* buffer, int64_t count, DataType dtype,
                   ReduceOp op);

}  // namespace ddl
