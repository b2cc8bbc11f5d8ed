// The negotiation's steady cycle through a node's shared memory
// (transport/node_agreement.h under negotiation/controller.h), with threads
// as ranks over real shared memory: each rank's Controller negotiates over
// a NodeAgreement whose inner plane counts what still goes over it (on MPI:
// the message rounds). A cache hit costs no inner operation; a miss, an
// eviction and a mismatch go by name as before and agree on every rank; a
// rank that dies during cached cycles ends the others' wait with the peer
// timeout naming it. Prints one line per failure and "<N> checks, <F>
// failures".
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "counting_plane.h"
#include "in_process.h"
#include "negotiation/controller.h"
#include "transport/node_agreement.h"

using namespace ddl;
using ddl_test::Counts;
using ddl_test::CountingPlane;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;
using Clock = std::chrono::steady_clock;

namespace {

Request Make(const std::string& name, int rank, std::vector<int64_t> shape = {4}) {
  Request r;
  r.name = name;
  r.rank = rank;
  r.dtype = r.wire = DataType::kFloat32;
  r.op = ReduceOp::kSum;
  r.shape = std::move(shape);
  return r;
}

std::string Rank(int r) { return " (rank " + std::to_string(r) + ")"; }

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// What one rank saw: every cycle's outcome, what went over the inner plane
// and how many ANDs shared memory carried; `error` if Negotiate threw.
struct RankRun {
  std::vector<Negotiated> cycles;
  Counts inner;
  uint64_t shm_rounds = 0;
  std::string error;
  std::vector<int> unreachable;
  double seconds = 0;  // from the start to the end of the last cycle or the throw
};

// offers(rank, cycle) -> that rank's offers before the cycle; `dies`:
// (rank, cycle) -> the rank ends before negotiating that cycle.
using Schedule = std::function<std::vector<Request>(int rank, int cycle)>;

std::vector<RankRun> Drive(int n, int cycles, const Schedule& offers, Config config = Config(),
                           std::function<bool(int, int)> dies = nullptr,
                           double peer_timeout_s = 0, size_t max_words = 64) {
  InProcessGroup group(n, 1 << 20);
  std::vector<RankRun> out(n);
  static int job = 0;
  const std::string token = "steady." + std::to_string(getpid()) + "." + std::to_string(++job);
  group.Run([&](int r) {
    InProcessRank world(group, r), node(group, r);
    CountingPlane counting(world);
    NodeAgreement plane(counting, node, token, max_words);
    plane.memory().SetPeerTimeout(peer_timeout_s);
    Controller controller(plane, config);
    const auto start = Clock::now();
    try {
      for (int c = 0; c < cycles; ++c) {
        for (const Request& q : offers(r, c)) {
          if (!controller.Offer(q)) throw std::runtime_error("duplicate offer of " + q.name);
        }
        if (dies && dies(r, c)) break;
        out[r].cycles.push_back(controller.Negotiate(false));
      }
    } catch (const PeerTimeout& e) {
      out[r].error = e.what();
      out[r].unreachable = e.unreachable();
    }
    out[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
    out[r].inner = counting.counts;
    out[r].shm_rounds = plane.rounds();
  });
  return out;
}

int Runs(const Negotiated& cycle, const std::string& name) {
  return static_cast<int>(std::count(cycle.run.begin(), cycle.run.end(), name));
}

// The same name every cycle: after the first (by name), every cycle runs it
// on every rank through the AND in shared memory alone.
void CacheHitsStayInSharedMemory() {
  const int n = 3, cycles = 300;
  auto out = Drive(n, cycles, [](int r, int) { return std::vector<Request>{Make("g", r)}; });
  for (int r = 0; r < n; ++r) {
    const RankRun& run = out[r];
    int ran = 0;
    for (const Negotiated& c : run.cycles) ran += Runs(c, "g");
    Expect(ran == cycles, "hit: g ran every cycle" + Rank(r) + ": " + std::to_string(ran));
    Expect(run.cycles[0].exchanged, "hit: the first cycle goes by name" + Rank(r));
    int exchanged = 0;
    for (const Negotiated& c : run.cycles) exchanged += c.exchanged;
    Expect(exchanged == 1, "hit: only the first cycle went by name" + Rank(r) + ": " +
                               std::to_string(exchanged));
    Expect(run.inner.and_ops == 0,
           "hit: no AND over the inner plane" + Rank(r) + ": " + std::to_string(run.inner.and_ops));
    Expect(run.inner.gathers == 1, "hit: one gather, the first cycle's" + Rank(r));
    Expect(run.shm_rounds == static_cast<uint64_t>(cycles),
           "hit: every cycle's AND in shared memory" + Rank(r));
  }
}

// A new name after many hits is a miss: that cycle goes by name, runs it
// with the cached one, and later cycles hit both.
void AMissGoesByNameThenHits() {
  const int n = 2, cycles = 120;
  auto out = Drive(n, cycles, [](int r, int c) {
    std::vector<Request> rq{Make("g", r)};
    if (c >= 100) rq.push_back(Make("late", r, {8}));
    return rq;
  });
  for (int r = 0; r < n; ++r) {
    const RankRun& run = out[r];
    Expect(run.cycles.size() == static_cast<size_t>(cycles), "miss: every cycle ran" + Rank(r));
    if (run.cycles.size() != static_cast<size_t>(cycles)) continue;
    Expect(run.cycles[100].exchanged && Runs(run.cycles[100], "late") == 1 &&
               Runs(run.cycles[100], "g") == 1,
           "miss: cycle 100 goes by name and runs both" + Rank(r));
    Expect(run.cycles[100].run == out[0].cycles[100].run, "miss: one order on every rank");
    bool later_hits = true;
    for (int c = 101; c < cycles; ++c) {
      later_hits &= !run.cycles[c].exchanged && run.cycles[c].run.size() == 2;
    }
    Expect(later_hits, "miss: cycles after the miss hit both names" + Rank(r));
    Expect(run.inner.gathers == 2 && run.inner.and_ops == 0,
           "miss: two by-name cycles, no inner AND" + Rank(r));
  }
}

// More names than slots: every cycle evicts and inserts, and still every
// name runs once a cycle, in the same order on every rank.
void EvictionsAgreeOnEveryRank() {
  Config config;
  config.cache_capacity = 2;
  const int n = 3, cycles = 40;
  auto out = Drive(n, cycles, [](int r, int c) {
    std::vector<Request> rq;
    for (int i = 0; i < 5; ++i) rq.push_back(Make("t" + std::to_string((i + c + r) % 5), r));
    return rq;
  }, config);
  int total = 0;
  bool same = true;
  for (int c = 0; c < cycles; ++c) {
    total += static_cast<int>(out[0].cycles[c].run.size());
    for (int r = 1; r < n; ++r) same &= out[r].cycles[c].run == out[0].cycles[c].run;
  }
  Expect(same, "eviction: the same runs on every rank in every cycle");
  Expect(total == 5 * cycles, "eviction: every name ran once a cycle: " + std::to_string(total));
  Expect(out[0].inner.and_ops == 0 && out[0].shm_rounds == static_cast<uint64_t>(cycles),
         "eviction: the ANDs stayed in shared memory");
}

// After 150 cached cycles rank 2 offers the name with another shape: every
// rank refuses it in the same cycle, naming the tensor, the shapes and the
// ranks; it never runs again.
void AMismatchAfterManyHitsIsRefusedEverywhere() {
  const int n = 3, cycles = 160, changed = 150;
  auto out = Drive(n, cycles, [](int r, int c) {
    if (c < changed) return std::vector<Request>{Make("k", r)};
    if (c == changed) return std::vector<Request>{Make("k", r, {r == 2 ? 5 : 4})};
    return std::vector<Request>{};
  });
  for (int r = 0; r < n; ++r) {
    const RankRun& run = out[r];
    Expect(run.error.empty(), "mismatch: no peer failure" + Rank(r) + ": " + run.error);
    int hits = 0, refused_at = -1, runs_after = 0;
    std::string message;
    for (int c = 0; c < static_cast<int>(run.cycles.size()); ++c) {
      if (c < changed) hits += Runs(run.cycles[c], "k");
      if (c >= changed) runs_after += Runs(run.cycles[c], "k");
      for (const auto& [name, m] : run.cycles[c].refused) {
        if (name == "k" && refused_at < 0) refused_at = c, message = m;
      }
    }
    Expect(hits == changed, "mismatch: k hit every cycle before the change" + Rank(r));
    Expect(runs_after == 0, "mismatch: k never runs after the change" + Rank(r));
    Expect(refused_at >= changed && refused_at == [&] {
             for (int c = changed; c < cycles; ++c) {
               if (!out[0].cycles[c].refused.empty()) return c;
             }
             return -1;
           }(),
           "mismatch: refused in the same cycle as rank 0" + Rank(r));
    Expect(Contains(message, "'k'") && Contains(message, "shape") && Contains(message, "[5]") &&
               Contains(message, "rank 2"),
           "mismatch: the refusal names the tensor, the shapes and the rank" + Rank(r) + ": " +
               message);
  }
}

// Rank 2 dies after 50 cached cycles, between offering and negotiating:
// ranks 0 and 1 wait for it in shared memory and end with PeerTimeout
// naming rank 2 within the timeout (and the failure note's short wait),
// instead of waiting forever.
void ARankDyingDuringCachedCyclesIsNamed() {
  const int n = 3, cycles = 200, dies_at = 50;
  const double timeout = 0.5;
  auto out = Drive(n, cycles, [](int r, int) { return std::vector<Request>{Make("g", r)}; },
                   Config(), [](int r, int c) { return r == 2 && c == dies_at; }, timeout);
  for (int r = 0; r < 2; ++r) {
    const RankRun& run = out[r];
    Expect(run.cycles.size() == static_cast<size_t>(dies_at),
           "death: cached cycles ran until rank 2 died" + Rank(r) + ": " +
               std::to_string(run.cycles.size()));
    Expect(run.unreachable == std::vector<int>{2},
           "death: the timeout names rank 2 as unreachable" + Rank(r) + ": " + run.error);
    Expect(Contains(run.error, "rank 2") && Contains(run.error, "node shared memory"),
           "death: the message says whom and where" + Rank(r) + ": " + run.error);
    // The timeout, then up to 3 s for a failure note that never comes.
    Expect(run.seconds < timeout + 3 + 2,
           "death: no long wait" + Rank(r) + ": " + std::to_string(run.seconds) + " s");
  }
}

// Word vectors longer than the agreement's slot (a cache of many names):
// the ANDs go over the inner plane on every rank alike, and cached cycles
// still run. With 3 words at most: the first cycle's vector (empty cache:
// flags and the ranks' word) fits, later ones (one name: 4 words) do not.
void LongWordVectorsGoOverTheInnerPlane() {
  const int n = 2, cycles = 20;
  auto out = Drive(n, cycles, [](int r, int) { return std::vector<Request>{Make("g", r)}; },
                   Config(), nullptr, 0, 3);
  for (int r = 0; r < n; ++r) {
    int ran = 0;
    for (const Negotiated& c : out[r].cycles) ran += Runs(c, "g");
    Expect(ran == cycles, "long words: g ran every cycle" + Rank(r));
    Expect(out[r].inner.and_ops == cycles - 1 && out[r].shm_rounds == 1,
           "long words: every AND over the inner plane" + Rank(r) + ": " +
               std::to_string(out[r].inner.and_ops) + " inner, " +
               std::to_string(out[r].shm_rounds) + " in shared memory");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  return ddl_test::RunNamedChecks({{"hit", CacheHitsStayInSharedMemory},
                                   {"miss", AMissGoesByNameThenHits},
                                   {"eviction", EvictionsAgreeOnEveryRank},
                                   {"mismatch", AMismatchAfterManyHitsIsRefusedEverywhere},
                                   {"death", ARankDyingDuringCachedCyclesIsNamed},
                                   {"long-words", LongWordVectorsGoOverTheInnerPlane}},
                                  only);
}
