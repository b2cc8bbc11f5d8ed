#include "types.h"

#include <sstream>

namespace ddl {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kInt16:
    case DataType::kUInt16:
      return 2;
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
  }
  return 0;
}

bool IsFloating(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

bool IsValidReduceOp(int value) { return value >= 0 && value <= 4; }

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kUInt16: return "uint16";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kAllgather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReducescatter: return "reducescatter";
    case Collective::kBarrier: return "barrier";
    case Collective::kAlltoall: return "alltoall";
    case Collective::kJoin: return "join";
  }
  return "unknown";
}

std::string OnRank(int rank) { return " (rank " + std::to_string(rank) + ")"; }

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out << ", ";
    out << shape[i];
  }
  out << "]";
  return out.str();
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace ddl
