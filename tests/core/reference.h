// The reference the algorithm checks compare against: two scalars combined
// as the reduce kernels define it (Average adds here; its division comes
// after the sum), and the DataType of a C++ element type.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace ddl_test {

template <typename T>
T Combine(ddl::ReduceOp op, T a, T b) {
  switch (op) {
    case ddl::ReduceOp::kMin: return b < a ? b : a;
    case ddl::ReduceOp::kMax: return a < b ? b : a;
    case ddl::ReduceOp::kProduct: return a * b;
    default: return a + b;  // kSum, kAverage
  }
}

template <typename T>
ddl::DataType TypeOf();
template <> inline ddl::DataType TypeOf<float>() { return ddl::DataType::kFloat32; }
template <> inline ddl::DataType TypeOf<double>() { return ddl::DataType::kFloat64; }
template <> inline ddl::DataType TypeOf<int32_t>() { return ddl::DataType::kInt32; }

}  // namespace ddl_test
