// The int16, uint16 and bool reduction kernels against their definitions:
// integer arithmetic in the dtype (wrapping as the dtype does), and for
// bool Sum/Max = or, Min/Product = and, with any nonzero byte read as true
// and every result written as 0 or 1. Exits non-zero on a mismatch.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/reduce_kernels.h"

using namespace ddl;

namespace {

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

template <typename T>
T Expected(T x, T y, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return x < y ? x : y;
    case ReduceOp::kMax: return x > y ? x : y;
    case ReduceOp::kProduct: return static_cast<T>(x * y);
    default: return static_cast<T>(x + y);
  }
}

template <typename T>
long CheckIntegers(DataType dtype, std::mt19937& rng, int n) {
  std::vector<T> a(n), b(n), out(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<T>(rng());  // every bit pattern: wrap-around included
    b[i] = static_cast<T>(rng());
  }
  long wrong = 0;
  for (ReduceOp op : kOps) {
    ReduceTo(out.data(), a.data(), b.data(), n, dtype, op);
    for (int i = 0; i < n; ++i) wrong += out[i] != Expected(a[i], b[i], op);
    std::vector<T> into = a;  // ReduceInto: dst aliases the first operand
    ReduceInto(into.data(), b.data(), n, dtype, op);
    for (int i = 0; i < n; ++i) wrong += into[i] != out[i];
  }
  return wrong;
}

long CheckBool(std::mt19937& rng, int n) {
  // Bytes 0, 1 and (as a defensive case) other nonzero values.
  std::vector<uint8_t> a(n), b(n), out(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<uint8_t>(rng() % 3 == 0 ? 0 : rng() % 4);
    b[i] = static_cast<uint8_t>(rng() % 2);
  }
  long wrong = 0;
  for (ReduceOp op : kOps) {
    ReduceTo(out.data(), a.data(), b.data(), n, DataType::kBool, op);
    const bool all = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    for (int i = 0; i < n; ++i) {
      const uint8_t expected = all ? (a[i] && b[i]) : (a[i] || b[i]);
      wrong += out[i] != expected;
    }
  }
  return wrong;
}

}  // namespace

int main() {
  std::mt19937 rng(2);
  const int n = (1 << 16) + 3;
  long wrong = CheckIntegers<int16_t>(DataType::kInt16, rng, n);
  wrong += CheckIntegers<uint16_t>(DataType::kUInt16, rng, n);
  wrong += CheckBool(rng, n);
  std::printf("int16/uint16/bool kernels: %ld mismatches\n", wrong);
  return wrong == 0 ? 0 : 1;
}
