// Plain value types shared by every layer of the collective core.
// Nothing here knows about TensorFlow or MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddl {

// Wire values: these numbers cross process boundaries and the ctypes/op
// attribute boundary, so they are fixed explicitly.
enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
  kInt16 = 8,
  kUInt16 = 9,
  kBool = 10,  // one byte, 0 or 1; reductions are logical (see ReduceTo)
};

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
};

enum class Collective : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kReducescatter = 3,
  kBarrier = 4,
  kAlltoall = 5,
  // Not a collective of its own: the engine keeps this rank joined (see
  // ddl.join) until every rank is, then completes it.
  kJoin = 6,
};

size_t DataTypeSize(DataType dtype);
bool IsFloating(DataType dtype);
bool IsValidReduceOp(int value);
const char* DataTypeName(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* CollectiveName(Collective c);
std::string ShapeString(const std::vector<int64_t>& shape);
// " (rank R)": appended to every message a user may see.
std::string OnRank(int rank);
int64_t NumElements(const std::vector<int64_t>& shape);

// What every rank must agree on about one named collective: the part of a
// Work (engine/work.h) that negotiation sends as a Request
// (negotiation/message.h). Both derive from it, so turning one into the
// other copies it whole and a field added here cannot be missed.
struct CollectiveSpec {
  std::string name;  // identical on every rank for the same collective
  Collective collective = Collective::kAllreduce;
  DataType dtype = DataType::kFloat32;
  // The dtype an allreduce's data crosses the network in: `dtype`, or for a
  // float32 tensor with compression, float16 / bfloat16 (see WireDtype).
  DataType wire = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  std::vector<int64_t> shape;
  // A problem with this rank's arguments that the binding found but must
  // not report alone (the other ranks would wait for this one): the engine
  // offers the collective anyway and negotiation fails it on every rank.
  // Also alltoall splits that do not fit. "" when it can run.
  std::string invalid;
};

class Status {
 public:
  enum class Code : uint8_t {
    kOk = 0,
    kInvalidArgument = 1,   // caller's mistake: mismatch, bad dtype, bad op
    kAborted = 2,           // the job is going down: shutdown, dead peer
    kFailedPrecondition = 3,// not initialised, used after shutdown
    kInternal = 4,          // MPI or invariant failure
    kDeadlineExceeded = 5,  // stall timeout
  };
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status Aborted(std::string m) { return Status(Code::kAborted, std::move(m)); }
  static Status FailedPrecondition(std::string m) {
    return Status(Code::kFailedPrecondition, std::move(m));
  }
  static Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }
  static Status DeadlineExceeded(std::string m) {
    return Status(Code::kDeadlineExceeded, std::move(m));
  }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace ddl
