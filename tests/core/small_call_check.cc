// The steady path of a small allreduce on one node (issue 48), with threads
// as ranks over real POSIX shared memory (tests/core/in_process.h):
//
// - allocations: after a few warm-up calls, a 4 KB NodeAllreduce call
//   allocates nothing on any rank (operator new is replaced in this
//   program and counts per thread);
// - the single-pass small allreduce (NodeAllreduce::RunSmall) gives every
//   rank the same bits as the general path (local ranks combined in rank
//   order, one division for Average), for odd lengths, 2 and 3 ranks, Sum,
//   Average and Max, interleaved with general calls on the same slots, and
//   wrapping the slot ring many times; it allocates nothing either;
// - a wait's naps are sharp: its thread's timer slack is 1 us after the
//   first nap (transport/wait.cc, SharpenNaps).
//
// Usage: small_call_check [--cost KIND CALLS]
//   without arguments: the checks, then "<N> checks, <F> failures";
//   --cost general|small CALLS: only CALLS 4 KB calls of one path on 2
//   ranks, for `valgrind --tool=callgrind --toggle-collect=...` to count
//   the instructions of a call (docs/performance-notes/2026-12-07-small-calls.md).
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>

#include "algorithms/node_allreduce.h"
#include "check.h"
#include "in_process.h"

namespace {
thread_local long allocations = 0;
}  // namespace

// Every allocation of this program goes through here, so a thread's count
// is what the code it ran allocated.
void* operator new(std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

std::atomic<int> arenas{0};

std::string Token() {
  return "small-check." + std::to_string(getpid()) + "." + std::to_string(arenas++);
}

float Combine(ReduceOp op, float a, float b) {
  if (op == ReduceOp::kMax) return a < b ? b : a;
  return a + b;
}

// Runs body(rank, allreduce) on each of `ranks` threads, every one with
// its NodeAllreduce over one fresh arena of 3 slots of `slot_bytes`.
template <typename Body>
void OnNode(int ranks, size_t slot_bytes, double timeout_s, Body body) {
  InProcessGroup node(ranks, 1 << 20);
  const std::string token = Token();
  node.Run([&](int r) {
    InProcessRank plane(node, r);
    auto arena = ShmArena::Create(plane, token, slot_bytes, 3);
    arena->SetPeerTimeout(timeout_s);
    TrafficCounters traffic;
    NodeAllreduce allreduce(*arena, nullptr, ranks, traffic);
    body(r, allreduce);
    plane.AllgatherInt64(0);  // no arena goes before every rank is done with it
  });
}

// Steady calls of 4 KB allocate nothing, on every rank, on either path.
void SteadyCallsAllocateNothing() {
  for (bool small : {false, true}) {
    constexpr int kRanks = 2, kWarmUp = 5, kCalls = 200;
    std::vector<long> counted(kRanks, -1);
    std::vector<float> seen(kRanks, 0);
    OnNode(kRanks, 64 << 10, 10, [&](int r, NodeAllreduce& allreduce) {
      std::vector<float> in(1024, static_cast<float>(r + 1)), out(1024, 0);
      const std::vector<Span> spans = {{in.data(), out.data(), 1024}};
      auto call = [&] {
        if (small) {
          allreduce.RunSmall(spans, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum);
        } else {
          allreduce.Run(spans, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum);
        }
      };
      for (int i = 0; i < kWarmUp; ++i) call();
      const long before = allocations;
      for (int i = 0; i < kCalls; ++i) call();
      counted[r] = allocations - before;
      seen[r] = out[1023];
    });
    const std::string path = small ? "RunSmall" : "Run";
    for (int r = 0; r < kRanks; ++r) {
      Expect(counted[r] == 0, path + ": rank " + std::to_string(r) + " allocated " +
                                  std::to_string(counted[r]) + " times in 200 steady 4 KB calls");
      Expect(seen[r] == 3.0f, path + ": rank " + std::to_string(r) + " got " +
                                  std::to_string(seen[r]) + ", not 1 + 2");
    }
  }
}

// RunSmall against the rank-order definition, interleaved with Run on the
// same arena (their chunks share the slot ring and its counters).
void SmallMatchesTheGeneralOrder(int ranks, ReduceOp op) {
  const std::vector<int64_t> lengths = {1, 3, 1000, 4097, 0, 777};
  constexpr int kRounds = 7;  // past the 3 slots a few times
  std::mt19937 rng(ranks * 10 + static_cast<int>(op));
  std::uniform_real_distribution<float> real(-1, 1);
  // in[r][t]
  std::vector<std::vector<std::vector<float>>> in(ranks);
  for (auto& mine : in) {
    for (int64_t n : lengths) {
      std::vector<float> v(n);
      for (auto& x : v) x = real(rng);
      mine.push_back(v);
    }
  }
  // out[round][r][t], from RunSmall in even rounds and Run in odd ones.
  std::vector<std::vector<std::vector<std::vector<float>>>> out(
      kRounds, std::vector<std::vector<std::vector<float>>>(ranks));
  OnNode(ranks, 32 << 10, 10, [&](int r, NodeAllreduce& allreduce) {
    for (int round = 0; round < kRounds; ++round) {
      auto& mine = out[round][r];
      std::vector<Span> spans;
      for (size_t t = 0; t < lengths.size(); ++t) {
        mine.emplace_back(lengths[t], std::nanf(""));
        spans.push_back({in[r][t].data(), mine[t].data(), lengths[t]});
      }
      // Alone, each tensor fits RunSmall's slot (4097 floats < 32 KB);
      // all six do not.
      if (round % 2 == 0) {
        for (const Span& s : spans) allreduce.RunSmall({s}, DataType::kFloat32, DataType::kFloat32, op);
      } else {
        allreduce.Run(spans, DataType::kFloat32, DataType::kFloat32, op);
      }
    }
  });
  const std::string label = std::to_string(ranks) + " ranks " + ReduceOpName(op);
  for (size_t t = 0; t < lengths.size(); ++t) {
    std::vector<float> want(lengths[t]);
    for (int64_t i = 0; i < lengths[t]; ++i) {
      float v = in[0][t][i];
      for (int r = 1; r < ranks; ++r) v = Combine(op, v, in[r][t][i]);
      want[i] = op == ReduceOp::kAverage ? v / static_cast<float>(ranks) : v;
    }
    for (int round = 0; round < kRounds; ++round) {
      for (int r = 0; r < ranks; ++r) {
        const auto& got = out[round][r][t];
        const bool same = want.empty() ||
                          std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
        Expect(same, label + " tensor " + std::to_string(t) + " round " + std::to_string(round) +
                         " rank " + std::to_string(r) + " (" +
                         (round % 2 == 0 ? "RunSmall" : "Run") +
                         ") is not the rank-order result");
      }
    }
  }
}

// A rank that never comes: RunSmall's wait ends in the arena's peer
// timeout naming it, as the general path's does.
void SmallNamesAMissingRank() {
  std::string message;
  OnNode(2, 4096, 0.2, [&](int r, NodeAllreduce& allreduce) {
    if (r != 0) return;
    std::vector<float> in(8, 1), out(8);
    try {
      allreduce.RunSmall({{in.data(), out.data(), 8}}, DataType::kFloat32, DataType::kFloat32,
                         ReduceOp::kSum);
    } catch (const PeerTimeout& e) {
      message = e.what();
    }
  });
  Expect(message.find("rank 1") != std::string::npos,
         "RunSmall's timeout names the missing rank: '" + message + "'");
}

// A wait's first nap sets its thread's timer slack to kNapSlackNs (from
// Linux's default 50 us), so that a 20 us nap does not last 70.
void NapsAreSharp() {
  unsigned long before = 0, after = 0;
  std::thread([&] {
    before = static_cast<unsigned long>(prctl(PR_GET_TIMERSLACK));
    Backoff backoff({0, 0, std::chrono::microseconds(20), std::chrono::microseconds(20)});
    backoff.Pause();
    after = static_cast<unsigned long>(prctl(PR_GET_TIMERSLACK));
  }).join();
  Expect(before != kNapSlackNs, "a fresh thread starts with another slack: " +
                                    std::to_string(before));
  Expect(after == kNapSlackNs, "after a nap its slack is " + std::to_string(kNapSlackNs) +
                                   " ns: " + std::to_string(after));
}

// Only `calls` 4 KB calls of one path, for callgrind.
int Cost(bool small, int calls) {
  OnNode(2, 64 << 10, 0, [&](int, NodeAllreduce& allreduce) {
    std::vector<float> in(1024, 1), out(1024);
    const std::vector<Span> spans = {{in.data(), out.data(), 1024}};
    for (int i = 0; i < calls; ++i) {
      if (small) {
        allreduce.RunSmall(spans, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum);
      } else {
        allreduce.Run(spans, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum);
      }
    }
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--cost") {
    return Cost(std::string(argv[2]) == "small", std::atoi(argv[3]));
  }
  SteadyCallsAllocateNothing();
  for (int ranks : {2, 3}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      SmallMatchesTheGeneralOrder(ranks, op);
    }
  }
  SmallNamesAMissingRank();
  NapsAreSharp();
  return ddl_test::Summary();
}
