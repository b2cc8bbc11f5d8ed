// PairwiseAlltoall and ExchangeCounts with threads as ranks
// (tests/core/in_process.h, no MPI): every rank's output against the definition,
// for 1..5 ranks, random splits with zeros, blocks of many chunks. The
// transport also checks the algorithm's bounds: no message above
// MaxMessageBytes, and at most kMaxOutstanding messages started and not
// yet waited for per rank. Exits non-zero on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "algorithms/alltoall.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

constexpr size_t kMaxMessage = 1000;  // small, so blocks go in many chunks
constexpr int kMaxOutstanding = 16;   // the algorithm's window, both directions

long RunOnce(int n, std::mt19937& rng) {
  const size_t row = 1 + rng() % 300;  // bytes per row
  // splits[r][p]: rows rank r sends to rank p; about a third are zero.
  std::vector<std::vector<int64_t>> splits(n, std::vector<int64_t>(n));
  for (auto& to : splits)
    for (auto& rows : to) rows = rng() % 3 == 0 ? 0 : rng() % 40;
  std::vector<std::vector<char>> inputs(n), outputs(n);
  for (int r = 0; r < n; ++r) {
    int64_t rows = 0;
    for (int64_t s : splits[r]) rows += s;
    inputs[r].resize(rows * row);
    for (char& c : inputs[r]) c = static_cast<char>(rng());
  }
  InProcessGroup group(n, kMaxMessage);
  std::vector<long> errors(n, 0);
  group.Run([&](int r) {
      InProcessRank t(group, r);
      std::vector<int64_t> from_each = ExchangeCounts(t, splits[r]);
      std::vector<size_t> send(n), recv(n);
      size_t total = 0;
      for (int p = 0; p < n; ++p) {
        if (from_each[p] != splits[p][r]) ++errors[r];
        send[p] = splits[r][p] * row;
        recv[p] = from_each[p] * row;
        total += recv[p];
      }
      outputs[r].resize(total);
      PairwiseAlltoall(t, inputs[r].data(), send, outputs[r].data(), recv);
      // Bounds: no message above kMaxMessage (the transport throws), none
      // empty (zero-byte parts are skipped), a bounded window in flight.
      errors[r] += t.empty_messages() + (t.max_outstanding() > kMaxOutstanding);
  });
  long wrong = 0;
  for (int r = 0; r < n; ++r) {
    wrong += errors[r];
    // The definition: rank r's output is, for p in order, the rows of
    // rank p's input that follow the rows p sent to ranks before r.
    std::vector<char> expected;
    for (int p = 0; p < n; ++p) {
      int64_t before = 0;
      for (int q = 0; q < r; ++q) before += splits[p][q];
      auto first = inputs[p].begin() + before * row;
      expected.insert(expected.end(), first, first + splits[p][r] * row);
    }
    wrong += expected != outputs[r];
  }
  return wrong;
}

}  // namespace

int main() {
  std::mt19937 rng(3);
  long wrong = 0;
  int runs = 0;
  for (int n = 1; n <= 5; ++n) {
    for (int k = 0; k < 6; ++k, ++runs) wrong += RunOnce(n, rng);
  }
  std::printf("alltoall over threads: %ld mismatches in %d runs\n", wrong, runs);
  return wrong == 0 ? 0 : 1;
}
