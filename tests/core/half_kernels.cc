// The vectorised float16 kernels (F16C, picked at run time) against the
// scalar definition: float arithmetic, one round-to-nearest-even per step.
// Random bit patterns cover subnormals, infinities and overflow; only a
// NaN's payload may differ. Exits non-zero on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/reduce_kernels.h"

using namespace ddl;

namespace {
bool IsNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
}  // namespace

int main() {
  std::mt19937 rng(1);
  const int n = (1 << 20) + 7;  // not a multiple of the 8 lanes: the tail too
  std::vector<uint16_t> a(n), b(n), out(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<uint16_t>(rng());
    b[i] = static_cast<uint16_t>(rng());
  }
  long wrong = 0;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kProduct, ReduceOp::kMin,
                      ReduceOp::kMax}) {
    ReduceTo(out.data(), a.data(), b.data(), n, DataType::kFloat16, op);
    for (int i = 0; i < n; ++i) {
      const float x = HalfToFloat(a[i]), y = HalfToFloat(b[i]);
      float r = x + y;
      if (op == ReduceOp::kProduct) r = x * y;
      if (op == ReduceOp::kMin) r = std::min(x, y);
      if (op == ReduceOp::kMax) r = std::max(x, y);
      const uint16_t expected = FloatToHalf(r);
      if (out[i] != expected && !(IsNan(out[i]) && IsNan(expected))) ++wrong;
    }
  }
  std::vector<uint16_t> divided = a;
  DivideBy(divided.data(), n, DataType::kFloat16, 3);
  for (int i = 0; i < n; ++i) {
    const uint16_t expected = FloatToHalf(HalfToFloat(a[i]) / 3.0f);
    if (divided[i] != expected && !(IsNan(divided[i]) && IsNan(expected))) ++wrong;
  }
  // The wire conversions: float32 -> float16 against FloatToHalf over random
  // float bit patterns (around half's range, overflow and subnormals
  // included), and float16 -> float32 against HalfToFloat.
  std::vector<float> floats(n), back(n);
  for (int i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    bits = (bits & 0x80000000u) | (0x30000000u + bits % 0x18000000u);  // ~2^-31 .. 2^17
    std::memcpy(&floats[i], &bits, sizeof(bits));
  }
  if (!Convert(out.data(), DataType::kFloat16, floats.data(), DataType::kFloat32, n)) ++wrong;
  for (int i = 0; i < n; ++i) {
    if (out[i] != FloatToHalf(floats[i])) ++wrong;
  }
  if (!Convert(back.data(), DataType::kFloat32, a.data(), DataType::kFloat16, n)) ++wrong;
  for (int i = 0; i < n; ++i) {
    const float expected = HalfToFloat(a[i]);
    if (std::memcmp(&back[i], &expected, sizeof(float)) != 0 &&
        !(IsNan(a[i]) && back[i] != back[i])) {
      ++wrong;
    }
  }
  if (Convert(out.data(), DataType::kFloat16, a.data(), DataType::kInt32, 1)) ++wrong;
  std::printf("float16 kernels: %ld mismatches in %d elements x 8 operations\n", wrong, n);
  return wrong == 0 ? 0 : 1;
}
