// The allreduce algorithms of custom_ops/algorithms on threads as ranks
// (tests/core/in_process.h): every rank count from 1 to 6, element counts
// around segment boundaries, messages limited to a few bytes so every
// chunking loop runs many rounds. Checked: the rank-order algorithms give
// exactly ((x0 op x1) op x2) ... (then one division for Average) for
// random floats, where any other order would differ; the ring gives the
// same bits on every rank and the exact result on integers; the
// reduce-scatters leave each rank its segment. Prints one line per
// failure and "<N> checks, <F> failures".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "algorithms/allreduce.h"
#include "algorithms/pairwise.h"
#include "algorithms/ring.h"
#include "check.h"
#include "in_process.h"
#include "reference.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;
using ddl_test::Combine;
using ddl_test::TypeOf;

namespace {

template <typename T>
std::vector<std::vector<T>> Inputs(int n, int64_t count, std::mt19937& rng) {
  std::vector<std::vector<T>> in(n, std::vector<T>(count));
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> small(-3, 3);
  for (auto& v : in) {
    for (auto& x : v) x = std::is_integral<T>::value ? T(small(rng)) : T(real(rng));
  }
  return in;
}

template <typename T>
std::vector<T> RankOrder(const std::vector<std::vector<T>>& in, ReduceOp op) {
  std::vector<T> out = in[0];
  for (size_t r = 1; r < in.size(); ++r) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = Combine(op, out[i], in[r][i]);
  }
  if (op == ReduceOp::kAverage) {
    for (auto& x : out) x = x / static_cast<T>(in.size());
  }
  return out;
}

using AllreduceFn = void (*)(Transport&, void*, int64_t, DataType, ReduceOp);

// Runs `fn` on every rank; returns each rank's result.
template <typename T>
std::vector<std::vector<T>> RunAllreduce(AllreduceFn fn, std::vector<std::vector<T>> data,
                                         ReduceOp op, size_t max_message) {
  InProcessGroup group(static_cast<int>(data.size()), max_message);
  group.Run([&](int r) {
    InProcessRank t(group, r);
    fn(t, data[r].data(), static_cast<int64_t>(data[r].size()), TypeOf<T>(), op);
  });
  return data;
}

std::string Label(const char* algo, int n, int64_t count, const char* type, ReduceOp op,
                  size_t max_message) {
  return std::string(algo) + " ranks=" + std::to_string(n) + " count=" + std::to_string(count) +
         " " + type + " " + ReduceOpName(op) + " max_message=" + std::to_string(max_message);
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <typename T>
void CheckRankOrder(const char* name, AllreduceFn fn, int n, int64_t count, ReduceOp op,
                    size_t max_message, const char* type, std::mt19937& rng) {
  auto in = Inputs<T>(n, count, rng);
  auto want = RankOrder(in, op);
  auto got = RunAllreduce(fn, in, op, max_message);
  for (int r = 0; r < n; ++r) {
    Expect(SameBits(got[r], want),
           Label(name, n, count, type, op, max_message) + " rank " + std::to_string(r) +
               " differs from the rank-order result");
  }
}

void CheckRing(int n, int64_t count, size_t max_message, std::mt19937& rng) {
  // Float sums differ with the order, so only agreement across ranks is
  // checked on floats; integers must be exact.
  auto fin = Inputs<float>(n, count, rng);
  auto fgot = RunAllreduce(RingAllreduce, fin, ReduceOp::kSum, max_message);
  for (int r = 1; r < n; ++r) {
    Expect(SameBits(fgot[r], fgot[0]),
           Label("ring", n, count, "float32", ReduceOp::kSum, max_message) + " rank " +
               std::to_string(r) + " differs from rank 0");
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    auto in = Inputs<int32_t>(n, count, rng);
    auto want = RankOrder(in, op);
    auto got = RunAllreduce(RingAllreduce, in, op, max_message);
    for (int r = 0; r < n; ++r) {
      Expect(SameBits(got[r], want), Label("ring", n, count, "int32", op, max_message) +
                                         " rank " + std::to_string(r) + " is not exact");
    }
  }
}

// Uneven segments, some empty: after either reduce-scatter, rank r's
// segment holds the reduction of that segment.
void CheckReduceScatter(int n, size_t max_message, std::mt19937& rng) {
  std::vector<int64_t> segments;
  for (int r = 0; r < n; ++r) segments.push_back(r % 3 == 1 ? 0 : 2 * r + 3);
  int64_t count = 0;
  for (int64_t s : segments) count += s;
  auto in = Inputs<int32_t>(n, count, rng);
  auto want = RankOrder(in, ReduceOp::kSum);
  using ScatterFn = void (*)(Transport&, void*, const std::vector<int64_t>&, DataType, ReduceOp);
  for (auto [name, fn] : {std::pair<const char*, ScatterFn>{"ring reduce-scatter", RingReduceScatter},
                          {"pairwise reduce-scatter", PairwiseReduceScatter}}) {
    auto data = in;
    InProcessGroup group(n, max_message);
    group.Run([&](int r) {
      InProcessRank t(group, r);
      fn(t, data[r].data(), segments, DataType::kInt32, ReduceOp::kSum);
    });
    int64_t offset = 0;
    for (int r = 0; r < n; ++r) {
      bool ok = std::equal(want.begin() + offset, want.begin() + offset + segments[r],
                           data[r].begin() + offset);
      Expect(ok, std::string(name) + " ranks=" + std::to_string(n) + " rank " +
                     std::to_string(r) + " segment wrong");
      offset += segments[r];
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(1234);
  const std::vector<int64_t> counts = {0, 1, 2, 5, 7, 64, 1001};
  for (size_t max_message : {size_t(8), size_t(40), size_t(1) << 20}) {
    for (int n = 1; n <= 6; ++n) {
      for (int64_t count : counts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
          CheckRankOrder<float>("direct exchange", DirectExchangeAllreduce, n, count, op,
                                max_message, "float32", rng);
          CheckRankOrder<double>("pairwise+ring", OrderedAllreduce, n, count, op, max_message,
                                 "float64", rng);
          for (const TransportAllreduce& a : AllreduceAlgorithms()) {
            CheckRankOrder<float>(a.name, a.run, n, count, op, max_message, "float32", rng);
          }
        }
        CheckRankOrder<int32_t>("pairwise+ring", OrderedAllreduce, n, count, ReduceOp::kProduct,
                                max_message, "int32", rng);
        CheckRing(n, count, max_message, rng);
      }
      CheckReduceScatter(n, max_message, rng);
    }
  }
  // The choice: small calls take the one-round exchange, big ones the
  // pairwise reduce-scatter + ring all-gather; one rank takes anything.
  Expect(std::string(FlatAlgorithm(ChooseAllreduce(4, 1024)).name) == "DIRECT_EXCHANGE_ALLREDUCE",
         "a 1 KB call over 4 ranks takes the direct exchange");
  Expect(std::string(FlatAlgorithm(ChooseAllreduce(4, 64 << 20)).name) == "PAIRWISE_RING_ALLREDUCE",
         "a 64 MB call over 4 ranks takes the pairwise ring");
  // The node allreduce's single pass: on one node up to 32 KB; across
  // nodes by size up to 64 KB, up to a slot when the autotuner names it,
  // never when it times the general path; never past the slot or empty.
  const size_t slot = 1 << 20;
  Expect(ChooseSinglePass(false, 4096, slot) && ChooseSinglePass(false, 32 << 10, slot) &&
             !ChooseSinglePass(false, (32 << 10) + 4, slot),
         "one node: the single pass up to 32 KB");
  Expect(ChooseSinglePass(true, 4096, slot) && ChooseSinglePass(true, 64 << 10, slot) &&
             !ChooseSinglePass(true, (64 << 10) + 4, slot),
         "across nodes, auto: the single pass up to 64 KB");
  Expect(ChooseSinglePass(true, slot, slot, NetworkChoice::kNodeLeader) &&
             !ChooseSinglePass(true, slot + 4, slot, NetworkChoice::kNodeLeader),
         "across nodes, kNodeLeader: the single pass up to a slot, not past it");
  Expect(!ChooseSinglePass(true, 4096, slot, NetworkChoice::kDirectExchange) &&
             !ChooseSinglePass(true, 4096, slot, NetworkChoice::kPairwiseRing),
         "across nodes, a network algorithm named: the general path");
  Expect(!ChooseSinglePass(false, 0, slot) && !ChooseSinglePass(true, 0, slot) &&
             !ChooseSinglePass(false, 8192, 4096),
         "nothing, or more than a slot: never the single pass");
  Expect(std::string(FlatAlgorithm(ChooseAllreduce(4, 1024, NetworkChoice::kNodeLeader)).name) ==
             "DIRECT_EXCHANGE_ALLREDUCE",
         "kNodeLeader is no flat algorithm: the cross-node step keeps the size rule");
  return ddl_test::Summary();
}
