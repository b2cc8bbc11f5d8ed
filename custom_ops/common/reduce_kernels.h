// Element-wise kernels the algorithms apply to byte buffers: combine two
// buffers with a reduction op, and scale a buffer (Average's division).
#pragma once

#include <cstdint>

#include "types.h"

namespace ddl {

// dst[i] = op(dst[i], src[i]) for i in [0, count). On bool, Sum and Max
// are logical or, Min and Product logical and (Average is refused before
// it gets here, as for integers).
void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);

// dst[i] = op(a[i], b[i]) for i in [0, count); dst may equal a or b (each
// element is read before it is written).
void ReduceTo(void* dst, const void* a, const void* b, int64_t count, DataType dtype,
              ReduceOp op);

// buffer[i] = buffer[i] / divisor, rounded once in the buffer's dtype.
// Only floating dtypes; integer Average is rejected before it gets here.
void DivideBy(void* buffer, int64_t count, DataType dtype, int divisor);

// dst[i] = src[i] converted from `from` to `to`, rounded to nearest even:
// float32 to or from float16 / bfloat16 (a wire format that halves the
// bytes on the network), or a plain copy when the dtypes are equal.
// Returns false, converting nothing, for any other pair.
bool Convert(void* dst, DataType to, const void* src, DataType from, int64_t count);

// Convert from float32 to float16 / bfloat16 with each value first
// multiplied by 1 / divisor in float32 (one rounding there, one into the
// 16-bit dtype): an Average over a 16-bit wire divides before it sums, so
// the sum on the wire overflows only where the float32 average would.
// Returns false, converting nothing, for any other pair.
bool ConvertDivided(void* dst, DataType to, const void* src, DataType from, int64_t count,
                    int divisor);

// Conversions used by the 16-bit float kernels, exposed for tests.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace ddl
