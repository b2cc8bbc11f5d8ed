#include "reduce_kernels.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DDL_F16C_KERNELS 1
#endif

namespace ddl {

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf / nan
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal: value = mantissa * 2^-24, exact in float
    float value = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    std::memcpy(&bits, &value, sizeof(bits));
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) {  // inf / nan keeps a quiet nan payload bit
    return sign | 0x7c00u | (abs_bits > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (abs_bits < 0x38800000u) {
    // Subnormal half (or zero): scale so the float add does the
    // round-to-nearest-even into the low mantissa bits for us.
    float magnitude;
    std::memcpy(&magnitude, &abs_bits, sizeof(magnitude));
    float shifted = magnitude + 0.5f;  // 0.5 = 2^-1: aligns 2^-24 units to the ulp
    uint32_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
    return sign | static_cast<uint16_t>(shifted_bits - 0x3f000000u);
  }
  // Normal: rebias exponent (127 -> 15) and round mantissa to 10 bits, ties to even.
  uint32_t odd = (abs_bits >> 13) & 1u;
  abs_bits += 0xc8000fffu + odd;  // -(112 << 23) rebias, plus rounding bias
  return sign | static_cast<uint16_t>(abs_bits >> 13);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t odd = (bits >> 16) & 1u;
  bits += 0x7fffu + odd;  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

namespace {

template <typename T>
inline T Apply(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return a + b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kProduct:
      return a * b;
  }
  return a;
}

// dst = a op b, one loop per op so the compiler can vectorise the common
// Sum case. dst may alias a (ReduceInto).
template <typename T>
void ReduceTyped(T* dst, const T* a, const T* b, int64_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      for (int64_t i = 0; i < count; ++i) dst[i] = a[i] + b[i];
      return;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < count; ++i) dst[i] = a[i] * b[i];
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < count; ++i) dst[i] = std::min(a[i], b[i]);
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < count; ++i) dst[i] = std::max(a[i], b[i]);
      return;
  }
}

// Bools (one byte each, 0 or 1): Sum and Max are "any", Min and Product
// "all". Results are written as 0 or 1 whatever nonzero byte came in.
void ReduceBool(uint8_t* dst, const uint8_t* a, const uint8_t* b, int64_t count, ReduceOp op) {
  if (op == ReduceOp::kMin || op == ReduceOp::kProduct) {
    for (int64_t i = 0; i < count; ++i) dst[i] = (a[i] != 0) & (b[i] != 0);
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = (a[i] != 0) | (b[i] != 0);
  }
}

// 16-bit floats are reduced in float and rounded back once per pairwise step.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Reduce16(uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t count, ReduceOp op) {
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = FromFloat(Apply(ToFloat(a[i]), ToFloat(b[i]), op));
  }
}

template <typename T>
void DivideTyped(T* buffer, int64_t count, int divisor) {
  const T d = static_cast<T>(divisor);
  for (int64_t i = 0; i < count; ++i) buffer[i] = buffer[i] / d;
}

#ifdef DDL_F16C_KERNELS
// float16 Sum / Product / division with the F16C conversions, eight lanes
// at a time: the same float arithmetic and round-to-nearest-even as the
// scalar code, so the same bits (only a NaN's payload may differ). Chosen
// at run time, so the build needs no -march.
bool HaveF16C() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}

enum class HalfOp { kAdd, kMul, kDivide };

// dst = a op b over float16 (kDivide: dst = a / divisor, b unused).
template <HalfOp kOp>
__attribute__((target("avx,f16c"))) void Half8(uint16_t* dst, const uint16_t* a,
                                                const uint16_t* b, int64_t count, float divisor) {
  const __m256 d = _mm256_set1_ps(divisor);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 r;
    if constexpr (kOp == HalfOp::kDivide) {
      r = _mm256_div_ps(x, d);
    } else {
      const __m256 y =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
      r = kOp == HalfOp::kAdd ? _mm256_add_ps(x, y) : _mm256_mul_ps(x, y);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < count; ++i) {  // the tail, as the scalar kernels do it
    const float x = HalfToFloat(a[i]);
    if constexpr (kOp == HalfOp::kDivide) {
      dst[i] = FloatToHalf(x / divisor);
    } else {
      const float y = HalfToFloat(b[i]);
      dst[i] = FloatToHalf(kOp == HalfOp::kAdd ? x + y : x * y);
    }
  }
}
#endif

#ifdef DDL_F16C_KERNELS
__attribute__((target("avx,f16c"))) void FloatsToHalf8(uint16_t* dst, const float* src,
                                                       int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < count; ++i) dst[i] = FloatToHalf(src[i]);
}

// FloatsToHalf8 of src[i] * scale (the product rounded to float first).
__attribute__((target("avx,f16c"))) void ScaledFloatsToHalf8(uint16_t* dst, const float* src,
                                                             int64_t count, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), s),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < count; ++i) dst[i] = FloatToHalf(src[i] * scale);
}

__attribute__((target("avx,f16c"))) void HalfsToFloat8(float* dst, const uint16_t* src,
                                                       int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < count; ++i) dst[i] = HalfToFloat(src[i]);
}
#endif

template <uint16_t (*FromFloat)(float)>
void FloatsTo16(uint16_t* dst, const float* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = FromFloat(src[i]);
}

template <uint16_t (*FromFloat)(float)>
void ScaledFloatsTo16(uint16_t* dst, const float* src, int64_t count, float scale) {
  for (int64_t i = 0; i < count; ++i) dst[i] = FromFloat(src[i] * scale);
}

template <float (*ToFloat)(uint16_t)>
void FloatsFrom16(float* dst, const uint16_t* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = ToFloat(src[i]);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Divide16(uint16_t* buffer, int64_t count, int divisor) {
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < count; ++i) buffer[i] = FromFloat(ToFloat(buffer[i]) / d);
}

}  // namespace

void ReduceTo(void* dst, const void* a, const void* b, int64_t count, DataType dtype,
              ReduceOp op) {
  switch (dtype) {
    case DataType::kFloat16:
#ifdef DDL_F16C_KERNELS
      if (HaveF16C() && op != ReduceOp::kMin && op != ReduceOp::kMax) {
        auto* out = static_cast<uint16_t*>(dst);
        auto* x = static_cast<const uint16_t*>(a);
        auto* y = static_cast<const uint16_t*>(b);
        return op == ReduceOp::kProduct ? Half8<HalfOp::kMul>(out, x, y, count, 1.0f)
                                         : Half8<HalfOp::kAdd>(out, x, y, count, 1.0f);
      }
#endif
      return Reduce16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst),
                                                static_cast<const uint16_t*>(a),
                                                static_cast<const uint16_t*>(b), count, op);
    case DataType::kBFloat16:
      return Reduce16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(dst),
                                                        static_cast<const uint16_t*>(a),
                                                        static_cast<const uint16_t*>(b), count, op);
    case DataType::kFloat32:
      return ReduceTyped(static_cast<float*>(dst), static_cast<const float*>(a),
                         static_cast<const float*>(b), count, op);
    case DataType::kFloat64:
      return ReduceTyped(static_cast<double*>(dst), static_cast<const double*>(a),
                         static_cast<const double*>(b), count, op);
    case DataType::kInt32:
      return ReduceTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                         static_cast<const int32_t*>(b), count, op);
    case DataType::kInt64:
      return ReduceTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                         static_cast<const int64_t*>(b), count, op);
    case DataType::kUInt8:
      return ReduceTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                         static_cast<const uint8_t*>(b), count, op);
    case DataType::kInt8:
      return ReduceTyped(static_cast<int8_t*>(dst), static_cast<const int8_t*>(a),
                         static_cast<const int8_t*>(b), count, op);
    case DataType::kInt16:
      return ReduceTyped(static_cast<int16_t*>(dst), static_cast<const int16_t*>(a),
                         static_cast<const int16_t*>(b), count, op);
    case DataType::kUInt16:
      return ReduceTyped(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                         static_cast<const uint16_t*>(b), count, op);
    case DataType::kBool:
      return ReduceBool(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                        static_cast<const uint8_t*>(b), count, op);
  }
}

bool Convert(void* dst, DataType to, const void* src, DataType from, int64_t count) {
  if (to == from) {
    if (count > 0 && dst != src) std::memcpy(dst, src, count * DataTypeSize(to));
    return true;
  }
  auto* f32_out = static_cast<float*>(dst);
  auto* f32_in = static_cast<const float*>(src);
  auto* u16_out = static_cast<uint16_t*>(dst);
  auto* u16_in = static_cast<const uint16_t*>(src);
  if (from == DataType::kFloat32 && to == DataType::kFloat16) {
#ifdef DDL_F16C_KERNELS
    if (HaveF16C()) return FloatsToHalf8(u16_out, f32_in, count), true;
#endif
    return FloatsTo16<FloatToHalf>(u16_out, f32_in, count), true;
  }
  if (from == DataType::kFloat16 && to == DataType::kFloat32) {
#ifdef DDL_F16C_KERNELS
    if (HaveF16C()) return HalfsToFloat8(f32_out, u16_in, count), true;
#endif
    return FloatsFrom16<HalfToFloat>(f32_out, u16_in, count), true;
  }
  if (from == DataType::kFloat32 && to == DataType::kBFloat16) {
    return FloatsTo16<FloatToBFloat16>(u16_out, f32_in, count), true;
  }
  if (from == DataType::kBFloat16 && to == DataType::kFloat32) {
    return FloatsFrom16<BFloat16ToFloat>(f32_out, u16_in, count), true;
  }
  return false;
}

bool ConvertDivided(void* dst, DataType to, const void* src, DataType from, int64_t count,
                    int divisor) {
  if (from != DataType::kFloat32 || divisor < 1) return false;
  const float scale = 1.0f / static_cast<float>(divisor);
  auto* out = static_cast<uint16_t*>(dst);
  auto* in = static_cast<const float*>(src);
  if (to == DataType::kFloat16) {
#ifdef DDL_F16C_KERNELS
    if (HaveF16C()) return ScaledFloatsToHalf8(out, in, count, scale), true;
#endif
    return ScaledFloatsTo16<FloatToHalf>(out, in, count, scale), true;
  }
  if (to == DataType::kBFloat16) {
    return ScaledFloatsTo16<FloatToBFloat16>(out, in, count, scale), true;
  }
  return false;
}

void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op) {
  ReduceTo(dst, dst, src, count, dtype, op);
}

void DivideBy(void* buffer, int64_t count, DataType dtype, int divisor) {
  switch (dtype) {
    case DataType::kFloat16:
#ifdef DDL_F16C_KERNELS
      if (HaveF16C()) {
        auto* data = static_cast<uint16_t*>(buffer);
        return Half8<HalfOp::kDivide>(data, data, data, count, static_cast<float>(divisor));
      }
#endif
      return Divide16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(buffer), count, divisor);
    case DataType::kBFloat16:
      return Divide16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(buffer), count,
                                                        divisor);
    case DataType::kFloat32:
      return DivideTyped(static_cast<float*>(buffer), count, divisor);
    case DataType::kFloat64:
      return DivideTyped(static_cast<double*>(buffer), count, divisor);
    default:
      return;  // integers never reach here (see header)
  }
}

}  // namespace ddl
