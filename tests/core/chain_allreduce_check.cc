// The chain allreduce (algorithms/chain_allreduce.h) on threads as ranks
// (tests/core/in_process.h): 1-17 ranks, every dtype and op, empty and odd
// lengths, pieces from one element (messages of a few bytes) up to the
// size rule's. Checked on every rank, bitwise: the rank-order result
// ((x0 op x1) op x2) ..., divided once for Average, computed here with the
// reduce kernels one rank at a time; so also the same bits on every rank,
// for every piece size, and as the direct exchange and the pairwise
// allreduce (both checked on the same inputs). Each rank sends to its two
// neighbours only, the buffer once each way, and nothing empty; a rank
// that never calls ends every other rank in the peer timeout. Also the
// size rule that picks the chain. Prints "<N> checks, <F> failures".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "algorithms/allreduce.h"
#include "algorithms/chain_allreduce.h"
#include "algorithms/pairwise.h"
#include "check.h"
#include "common/reduce_kernels.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

// Forwards to a rank of the harness and records, per peer, the bytes sent
// to it and whether any message went to or came from it.
class RecordingTransport : public Transport {
 public:
  explicit RecordingTransport(InProcessRank& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Handle Isend(const void* data, size_t bytes, int peer, int tag) override {
    sent_[peer] += bytes;
    peers_.insert(peer);
    empty_ += bytes == 0;
    return inner_.Isend(data, bytes, peer, tag);
  }
  Handle Irecv(void* data, size_t bytes, int peer, int tag) override {
    peers_.insert(peer);
    empty_ += bytes == 0;
    return inner_.Irecv(data, bytes, peer, tag);
  }
  void Wait(Handle h) override { inner_.Wait(h); }
  bool Test(Handle h) override { return inner_.Test(h); }
  int64_t Probe(int peer, int tag) override { return inner_.Probe(peer, tag); }
  size_t MaxMessageBytes() const override { return inner_.MaxMessageBytes(); }

  std::map<int, uint64_t> sent_;
  std::set<int> peers_;
  int empty_ = 0;

 private:
  InProcessRank& inner_;
};

const std::vector<DataType> kDtypes = {
    DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
    DataType::kInt32,   DataType::kInt64,    DataType::kUInt8,   DataType::kInt8,
    DataType::kInt16,   DataType::kUInt16,   DataType::kBool};

// Random values of `dtype`: floats in [-1, 1] (through float32 for the
// 16-bit ones), integers in [-3, 3] ([0, 3] unsigned), bools 0 or 1.
std::vector<char> RandomValues(DataType dtype, int64_t count, std::mt19937& rng) {
  const size_t elem = DataTypeSize(dtype);
  std::vector<char> out(static_cast<size_t>(count) * elem);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  for (int64_t i = 0; i < count; ++i) {
    char* p = out.data() + i * elem;
    const int v = small(rng);
    switch (dtype) {
      case DataType::kFloat16: { uint16_t h = FloatToHalf(real(rng)); std::memcpy(p, &h, 2); break; }
      case DataType::kBFloat16: { uint16_t b = FloatToBFloat16(real(rng)); std::memcpy(p, &b, 2); break; }
      case DataType::kFloat32: { float f = real(rng); std::memcpy(p, &f, 4); break; }
      case DataType::kFloat64: { double d = real(rng) * 0.37; std::memcpy(p, &d, 8); break; }
      case DataType::kInt32: { int32_t x = v; std::memcpy(p, &x, 4); break; }
      case DataType::kInt64: { int64_t x = v; std::memcpy(p, &x, 8); break; }
      case DataType::kUInt8: { uint8_t x = static_cast<uint8_t>(v + 3) / 2; std::memcpy(p, &x, 1); break; }
      case DataType::kInt8: { int8_t x = static_cast<int8_t>(v); std::memcpy(p, &x, 1); break; }
      case DataType::kInt16: { int16_t x = static_cast<int16_t>(v); std::memcpy(p, &x, 2); break; }
      case DataType::kUInt16: { uint16_t x = static_cast<uint16_t>(v + 3); std::memcpy(p, &x, 2); break; }
      case DataType::kBool: { uint8_t x = v > 0; std::memcpy(p, &x, 1); break; }
    }
  }
  return out;
}

// The promised result: the ranks' values combined in rank order by the
// reduce kernels, ((x0 op x1) op x2) ..., then one division for Average.
std::vector<char> RankOrder(const std::vector<std::vector<char>>& in, int64_t count,
                            DataType dtype, ReduceOp op) {
  std::vector<char> out = in[0];
  const ReduceOp sum_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  for (size_t r = 1; r < in.size(); ++r) ReduceTo(out.data(), out.data(), in[r].data(), count, dtype, sum_op);
  if (op == ReduceOp::kAverage) DivideBy(out.data(), count, dtype, static_cast<int>(in.size()));
  return out;
}

enum class Algo { kChain, kDirect, kPairwise };

// Runs one algorithm on every rank over copies of `in`; returns the
// results and, for the chain, checks its links and bytes.
std::vector<std::vector<char>> Run(Algo algo, const std::vector<std::vector<char>>& in,
                                   int64_t count, DataType dtype, ReduceOp op,
                                   size_t max_message, size_t piece_bytes,
                                   const std::string& label) {
  const int n = static_cast<int>(in.size());
  std::vector<std::vector<char>> data = in;
  InProcessGroup group(n, max_message);
  std::vector<std::string> problems(n);
  group.Run([&](int r) {
    InProcessRank rank(group, r);
    RecordingTransport t(rank);
    switch (algo) {
      case Algo::kChain: ChainAllreduce(t, data[r].data(), count, dtype, op, piece_bytes); break;
      case Algo::kDirect: DirectExchangeAllreduce(t, data[r].data(), count, dtype, op); break;
      case Algo::kPairwise: OrderedAllreduce(t, data[r].data(), count, dtype, op); break;
    }
    if (algo != Algo::kChain) return;
    const uint64_t bytes = static_cast<uint64_t>(count) * DataTypeSize(dtype);
    std::string& p = problems[r];
    for (int peer : t.peers_) {
      if (peer != r - 1 && peer != r + 1) p += " talked to rank " + std::to_string(peer) + ";";
    }
    // Up the chain the partial, down it the result: the buffer once each way.
    const uint64_t up = r + 1 < n && count > 0 ? bytes : 0;
    const uint64_t down = r > 0 && count > 0 ? bytes : 0;
    if (t.sent_[r + 1] != up || t.sent_[r - 1] != down) {
      p += " sent " + std::to_string(t.sent_[r + 1]) + " up and " + std::to_string(t.sent_[r - 1]) +
           " down, not " + std::to_string(up) + " and " + std::to_string(down) + ";";
    }
    if (t.empty_ > 0) p += " " + std::to_string(t.empty_) + " empty messages;";
  });
  for (int r = 0; r < n; ++r) {
    Expect(problems[r].empty(), label + " rank " + std::to_string(r) + ":" + problems[r]);
  }
  return data;
}

std::string Label(const char* what, int n, int64_t count, DataType dtype, ReduceOp op,
                  size_t max_message, size_t piece) {
  return std::string(what) + " ranks=" + std::to_string(n) + " count=" + std::to_string(count) +
         " " + DataTypeName(dtype) + " " + ReduceOpName(op) + " max_message=" +
         std::to_string(max_message) + " piece=" + std::to_string(piece);
}

void CheckChain(int n, int64_t count, DataType dtype, ReduceOp op, size_t max_message,
                size_t piece, std::mt19937& rng, bool against_others = false) {
  std::vector<std::vector<char>> in;
  for (int r = 0; r < n; ++r) in.push_back(RandomValues(dtype, count, rng));
  const std::vector<char> want = RankOrder(in, count, dtype, op);
  const std::string label = Label("chain", n, count, dtype, op, max_message, piece);
  const auto got = Run(Algo::kChain, in, count, dtype, op, max_message, piece, label);
  for (int r = 0; r < n; ++r) {
    Expect(got[r] == want, label + " rank " + std::to_string(r) + " is not the rank-order result");
  }
  if (!against_others) return;
  // The other flat allreduces give the same bits: a call may take either.
  for (Algo other : {Algo::kDirect, Algo::kPairwise}) {
    const auto theirs = Run(other, in, count, dtype, op, max_message, piece, label);
    Expect(theirs[0] == got[0], label + (other == Algo::kDirect ? ": direct exchange" : ": pairwise") +
                                    " gives other bits");
  }
}

bool Floating(DataType d) {
  return d == DataType::kFloat16 || d == DataType::kBFloat16 || d == DataType::kFloat32 ||
         d == DataType::kFloat64;
}

// A rank that never calls: every other rank throws PeerTimeout (it polls,
// then blocks in the transport's wait, which applies the timeout).
void CheckAbsentRankTimesOut(int n, int absent) {
  InProcessGroup group(n, 1 << 20);
  std::vector<int> timed_out(n, 0);
  group.Run([&](int r) {
    if (r == absent) return;
    InProcessRank t(group, r);
    t.SetPeerTimeout(0.5);
    std::vector<float> data(1 << 14, 1.0f);
    try {
      ChainAllreduce(t, data.data(), static_cast<int64_t>(data.size()), DataType::kFloat32,
                     ReduceOp::kSum, 4096);
    } catch (const PeerTimeout&) {
      timed_out[r] = 1;
    }
  });
  for (int r = 0; r < n; ++r) {
    if (r != absent) {
      Expect(timed_out[r] == 1, "chain over " + std::to_string(n) + " ranks: rank " +
                                    std::to_string(r) + " times out when rank " +
                                    std::to_string(absent) + " never calls");
    }
  }
}

void CheckRule() {
  const auto name = [](int ranks, size_t bytes, NetworkChoice c, NetworkShape s) {
    return std::string(FlatAlgorithm(ChooseAllreduce(ranks, bytes, c, s)).name);
  };
  const NetworkChoice kAuto = NetworkChoice::kAuto;
  const NetworkShape kUnknown = NetworkShape::kUnknown, kOne = NetworkShape::kOneSwitch;
  Expect(name(8, 64 << 20, kAuto, kUnknown) == "CHAIN_ALLREDUCE",
         "64 MB over 8 ranks of an unknown network: the chain");
  Expect(name(3, kChainMinBytes, kAuto, kUnknown) == "CHAIN_ALLREDUCE",
         "kChainMinBytes over 3 ranks of an unknown network: the chain");
  Expect(name(3, kChainMinBytes - 4, kAuto, kUnknown) == "PAIRWISE_RING_ALLREDUCE",
         "just under kChainMinBytes over 3 ranks of an unknown network: the pairwise ring");
  Expect(name(8, 64 << 20, kAuto, kOne) == "PAIRWISE_RING_ALLREDUCE",
         "64 MB over 8 ranks of one switch: the pairwise ring");
  Expect(name(2, 64 << 20, kAuto, kUnknown) == "PAIRWISE_RING_ALLREDUCE",
         "64 MB over 2 ranks (both send the buffer once either way): the pairwise ring");
  Expect(name(8, 4096, kAuto, kUnknown) == "DIRECT_EXCHANGE_ALLREDUCE",
         "4 KB over 8 ranks: the direct exchange");
  Expect(name(8, 4096, NetworkChoice::kChain, kOne) == "CHAIN_ALLREDUCE",
         "the chain by choice whatever the size and network");
  Expect(name(8, 64 << 20, NetworkChoice::kPairwiseRing, kUnknown) == "PAIRWISE_RING_ALLREDUCE",
         "the pairwise ring by choice on an unknown network");
  Expect(name(8, 64 << 20, NetworkChoice::kRackExchange, kUnknown) == "CHAIN_ALLREDUCE",
         "a choice of another step is the size rule");
  // Pieces: about 8 per hop within 64 KiB - 1 MiB, a small call whole.
  Expect(ChainPieceBytes(64 << 20, 8) == (1 << 20), "64 MiB over 8 ranks: 1 MiB pieces");
  Expect(ChainPieceBytes(16 << 20, 8) == (16 << 20) / 56, "16 MiB over 8 ranks: 1/56 of it");
  Expect(ChainPieceBytes(1 << 20, 16) == (64 << 10), "1 MiB over 16 ranks: the 64 KiB floor");
  Expect(ChainPieceBytes(5000, 4) == 5000, "a 5000-byte call is one piece");
}

}  // namespace

int main() {
  std::mt19937 rng(39);
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                     ReduceOp::kMax, ReduceOp::kProduct};
  // Every dtype and op over 1-17 ranks, odd lengths, pieces of a few
  // elements (messages of 8 bytes: several per piece's worth) and whole.
  for (int n = 1; n <= 17; ++n) {
    for (DataType dtype : kDtypes) {
      for (ReduceOp op : ops) {
        if (op == ReduceOp::kAverage && !Floating(dtype)) continue;  // refused before here
        CheckChain(n, 37, dtype, op, 8, 12, rng);
        CheckChain(n, 1001, dtype, op, size_t(1) << 20, 0, rng, n <= 6);
      }
    }
    for (int64_t count : {int64_t(0), int64_t(1), int64_t(2), int64_t(5)}) {
      CheckChain(n, count, DataType::kFloat32, ReduceOp::kSum, 8, 1, rng);
    }
  }
  // Pieces of one element to a few hundred bytes, many pieces in flight,
  // counts around the piece boundaries.
  for (int n : {2, 3, 5, 9, 17}) {
    for (int64_t count : {int64_t(63), int64_t(64), int64_t(65), int64_t(4099)}) {
      for (size_t piece : {size_t(4), size_t(256), size_t(1000)}) {
        CheckChain(n, count, DataType::kFloat32, ReduceOp::kSum, 1 << 20, piece, rng);
        CheckChain(n, count, DataType::kFloat64, ReduceOp::kAverage, 40, piece, rng);
      }
    }
  }
  CheckAbsentRankTimesOut(4, 2);
  CheckAbsentRankTimesOut(5, 0);
  CheckAbsentRankTimesOut(3, 2);
  CheckRule();
  return ddl_test::Summary();
}
