#include "message.h"

#include <cstring>
#include <string>
#include <sstream>
#include <stdexcept>

namespace ddl {

namespace {
// Allgather concatenates and alltoall exchanges rows of axis 0: each rank
// may bring its own number of rows.
bool FirstDimMayDiffer(Collective c) {
  return c == Collective::kAllgather || c == Collective::kAlltoall;
}
}  // namespace

bool Request::Compatible(const Request& other) const {
  if (collective != other.collective || dtype != other.dtype || wire != other.wire ||
      op != other.op || root != other.root || shape.size() != other.shape.size() ||
      !invalid.empty() || !other.invalid.empty()) {
    return false;
  }
  size_t first = FirstDimMayDiffer(collective) ? 1 : 0;
  for (size_t i = first; i < shape.size(); ++i) {
    if (shape[i] != other.shape[i]) return false;
  }
  return true;
}

std::string Request::Difference(const Request& other) const {
  std::ostringstream out;
  auto pair = [&](const char* what, const std::string& a, const std::string& b) {
    out << what << " " << a << " on rank " << rank << " but " << b << " on rank " << other.rank;
  };
  if (collective != other.collective) {
    pair("operation", CollectiveName(collective), CollectiveName(other.collective));
  } else if (dtype != other.dtype) {
    pair("dtype", DataTypeName(dtype), DataTypeName(other.dtype));
  } else if (wire != other.wire) {
    auto compression = [&](DataType w) {
      return w == dtype ? std::string("none") : std::string(DataTypeName(w));
    };
    pair("compression", compression(wire), compression(other.wire));
  } else if (op != other.op) {
    pair("reduction op", ReduceOpName(op), ReduceOpName(other.op));
  } else if (root != other.root) {
    pair("root_rank", std::to_string(root), std::to_string(other.root));
  } else if (FirstDimMayDiffer(collective)) {
    pair("shape (all dimensions but the first must match)", ShapeString(shape),
         ShapeString(other.shape));
  } else {
    pair("shape", ShapeString(shape), ShapeString(other.shape));
  }
  return out.str();
}

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    const char* p = reinterpret_cast<const char*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  std::vector<char> Take() { return std::move(bytes_); }

 private:
  std::vector<char> bytes_;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& bytes) : bytes_(bytes) {}
  template <typename T>
  T Get() {
    Need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string GetString() {
    uint32_t n = Get<uint32_t>();
    Need(n);
    std::string s(bytes_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  // A count of items of at least `least` bytes each: one the rest of the
  // message cannot hold is refused before anything is allocated for it
  // (a peer's 4-byte count would otherwise size a vector of billions).
  size_t GetCount(size_t least, const char* what) {
    const uint32_t n = Get<uint32_t>();
    if (static_cast<uint64_t>(n) * least > bytes_.size() - pos_) {
      throw std::runtime_error("malformed negotiation message: " + std::to_string(n) + " " +
                               what + " cannot fit in the " +
                               std::to_string(bytes_.size() - pos_) + " bytes left");
    }
    return n;
  }
  // One byte that must be below `limit` (an enum's values).
  uint8_t GetCode(int limit, const char* what) {
    const uint8_t v = Get<uint8_t>();
    if (v >= limit) {
      throw std::runtime_error("malformed negotiation message: " + std::string(what) + " code " +
                               std::to_string(v) + " is unknown");
    }
    return v;
  }
  // Every decoder ends here: bytes left after the message's last field
  // mean the sender wrote another format (another keras_ddl build), so the
  // fields read may be wrong too; refused, not ignored.
  void ExpectEnd(const char* what) const {
    if (pos_ == bytes_.size()) return;
    throw std::runtime_error("malformed negotiation message: " + std::string(what) + " has " +
                             std::to_string(bytes_.size() - pos_) + " byte(s) after its end, at " +
                             std::to_string(pos_) + " of " + std::to_string(bytes_.size()));
  }

 private:
  void Need(size_t n) const {
    if (n > bytes_.size() - pos_) throw std::runtime_error("truncated negotiation message");
  }
  const std::vector<char>& bytes_;
  size_t pos_ = 0;
};

// The values each enum of a request may take (common/types.h).
constexpr int kCollectives = static_cast<int>(Collective::kJoin) + 1;
constexpr int kDataTypes = static_cast<int>(DataType::kBool) + 1;
constexpr int kReduceOps = static_cast<int>(ReduceOp::kProduct) + 1;
// The fewest bytes an encoded string and request take (a request: name,
// rank, four codes, root, shape count, invalid).
constexpr size_t kLeastString = 4;
constexpr size_t kLeastRequest = 4 + 4 + 4 + 4 + 4 + 4;

void PutRequest(Writer& w, const Request& r) {
  w.PutString(r.name);
  w.Put<int32_t>(r.rank);
  w.Put<uint8_t>(static_cast<uint8_t>(r.collective));
  w.Put<uint8_t>(static_cast<uint8_t>(r.dtype));
  w.Put<uint8_t>(static_cast<uint8_t>(r.wire));
  w.Put<uint8_t>(static_cast<uint8_t>(r.op));
  w.Put<int32_t>(r.root);
  w.Put<uint32_t>(static_cast<uint32_t>(r.shape.size()));
  for (int64_t d : r.shape) w.Put<int64_t>(d);
  w.PutString(r.invalid);
}

Request GetRequest(Reader& rd) {
  Request r;
  r.name = rd.GetString();
  r.rank = rd.Get<int32_t>();
  r.collective = static_cast<Collective>(rd.GetCode(kCollectives, "collective"));
  r.dtype = static_cast<DataType>(rd.GetCode(kDataTypes, "dtype"));
  r.wire = static_cast<DataType>(rd.GetCode(kDataTypes, "wire dtype"));
  r.op = static_cast<ReduceOp>(rd.GetCode(kReduceOps, "reduction op"));
  r.root = rd.Get<int32_t>();
  r.shape.resize(rd.GetCount(sizeof(int64_t), "dimensions"));
  for (int64_t& d : r.shape) d = rd.Get<int64_t>();
  r.invalid = rd.GetString();
  return r;
}

}  // namespace

std::vector<char> EncodeRequests(const std::vector<Request>& requests) {
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(requests.size()));
  for (const Request& r : requests) PutRequest(w, r);
  return w.Take();
}

std::vector<Request> DecodeRequests(const std::vector<char>& bytes) {
  std::vector<Request> requests;
  if (bytes.empty()) return requests;
  Reader rd(bytes);
  requests.resize(rd.GetCount(kLeastRequest, "requests"));
  for (Request& r : requests) r = GetRequest(rd);
  rd.ExpectEnd("requests");
  return requests;
}

std::vector<char> EncodeResponses(const ResponseList& responses) {
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(responses.ready.size()));
  for (const auto& name : responses.ready) w.PutString(name);
  w.Put<uint32_t>(static_cast<uint32_t>(responses.errors.size()));
  for (const auto& e : responses.errors) {
    w.PutString(e.first);
    w.PutString(e.second);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(responses.evictions.size()));
  for (const auto& name : responses.evictions) w.PutString(name);
  w.PutString(responses.fatal);
  w.Put<uint32_t>(static_cast<uint32_t>(responses.stand_ins.size()));
  for (const Request& r : responses.stand_ins) PutRequest(w, r);
  return w.Take();
}

ResponseList DecodeResponses(const std::vector<char>& bytes) {
  ResponseList out;
  Reader rd(bytes);
  out.ready.resize(rd.GetCount(kLeastString, "ready names"));
  for (auto& name : out.ready) name = rd.GetString();
  out.errors.resize(rd.GetCount(2 * kLeastString, "errors"));
  for (auto& e : out.errors) {
    e.first = rd.GetString();
    e.second = rd.GetString();
  }
  out.evictions.resize(rd.GetCount(kLeastString, "evictions"));
  for (auto& name : out.evictions) name = rd.GetString();
  out.fatal = rd.GetString();
  out.stand_ins.resize(rd.GetCount(kLeastRequest, "stand-ins"));
  for (Request& r : out.stand_ins) r = GetRequest(rd);
  rd.ExpectEnd("responses");
  return out;
}

}  // namespace ddl
