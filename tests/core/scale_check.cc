// The whole engine at 64, 128 and 256 thread-ranks (tests/core/in_process.h):
// contexts, negotiation, the node's shared memory, the rack pipeline and
// the fault verdicts, with the links of tests/core/network.h.
//
//   results  - several rack x node x local shapes: three fused tensors of
//              odd lengths per call, offered in a different order on each
//              rank; every rank's bits equal the reference sum in the
//              promised order (local ranks, then the nodes of a rack, then
//              the racks; rank order when flat);
//   slow     - 256 ranks, 4 racks: uplinks slow enough that nothing
//              completes for several peer timeouts, yet the bytes move,
//              and that stall together for 1.5 s of every 2 s (longer
//              than the judge's window, shorter than the timeout): every
//              call succeeds, bitwise, and takes longer than the timeout
//              (the judge kept the waits going: health/liveness.h);
//   silent   - 256 ranks: one node's link passes nothing: every rank fails
//              its call with the report that a collective hangs (no bytes
//              move, every rank answers), within a few timeouts;
//   stopped  - 256 ranks: one rank never runs its engine: every other rank
//              fails in negotiation naming it (the stall diagnosis).
//
// `scale_check --table [calls]` prints instead the figures of the table in
// docs/failures.md: per rank count, the time per call and the silent
// verdict's time, as medians with their range. Prints "<N> checks, <F> failures".
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "engine/engine.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  int racks, nodes_per_rack, local;
  int ranks() const { return racks * nodes_per_rack * local; }
  std::string Name() const {
    return std::to_string(racks) + " rack(s) x " + std::to_string(nodes_per_rack) + " nodes x " +
           std::to_string(local) + " local = " + std::to_string(ranks()) + " ranks";
  }
};

// What the job's ranks run with (every thread reads the process's
// environment; the racks come from each thread-rank's own, see Racks).
void Configure(const Shape& shape, double timeout_s) {
  setenv("DDL_ALLREDUCE", "auto", 1);
  setenv("DDL_LOCAL_SIZE", std::to_string(shape.local).c_str(), 1);
  setenv("DDL_SHM_POOL_MB", "0", 1);
  // Slots of 64-256 KiB: the staging areas of up to 64 nodes stay small.
  setenv("DDL_SHM_ARENA_MB", "4", 1);
  setenv("DDL_PEER_TIMEOUT_S", std::to_string(timeout_s).c_str(), 1);
  setenv("DDL_STALL_WARNING_S", "1000", 1);
}

// Slurm's topology address of a thread-rank: rack and node by world rank.
Context::Environment Racks(const Shape& shape, int rank) {
  const int node = rank / shape.local;
  auto addr = std::make_shared<std::string>("core.rack" +
                                            std::to_string(node / shape.nodes_per_rack) + ".node" +
                                            std::to_string(node));
  const bool racks = shape.racks > 1;
  return [addr, racks](const char* name) -> const char* {
    if (racks && std::strcmp(name, "SLURM_TOPOLOGY_ADDR") == 0) return addr->c_str();
    return nullptr;
  };
}

// Values of different magnitudes: the order of a float sum shows.
float Value(int rank, int call, int64_t i) {
  const uint32_t h = static_cast<uint32_t>((rank + 1) * 2654435761u ^ (call * 40503u) ^
                                           static_cast<uint32_t>(i * 97));
  return std::ldexp(static_cast<float>(h % 100000) / 7.0f, static_cast<int>(rank % 13) - 6);
}

// The promised order: each node's local ranks in order; the nodes of a
// rack in order; the racks in order (one rack: the nodes in order).
float Reference(const Shape& shape, int call, int64_t i) {
  float total = 0;
  for (int rack = 0; rack < shape.racks; ++rack) {
    float rack_sum = 0;
    for (int n = 0; n < shape.nodes_per_rack; ++n) {
      const int first = (rack * shape.nodes_per_rack + n) * shape.local;
      float node_sum = Value(first, call, i);
      for (int l = 1; l < shape.local; ++l) node_sum += Value(first + l, call, i);
      rack_sum = n == 0 ? node_sum : rack_sum + node_sum;
    }
    total = rack == 0 ? rack_sum : total + rack_sum;
  }
  return total;
}

const std::vector<int64_t> kLengths = {1, 3001, 40009};

struct Outcome {
  std::vector<double> call_seconds;  // per call, the slowest rank's
  std::vector<double> fail_seconds;  // per rank that failed: call start to failure
  std::vector<std::string> failures; // their messages
  int mismatches = 0;
  int ok_tensors = 0;
};

// Runs `calls` calls of the three tensors on every rank of `shape`.
// `prepare(group)` may set the links first, `at_start(group)` once every
// context is built; `idle_rank` (if >= 0) builds its context but never
// runs an engine.
Outcome Run(const Shape& shape, int calls, double timeout_s,
            const std::function<void(InProcessGroup&)>& prepare = nullptr, int idle_rank = -1,
            const std::function<void(InProcessGroup&)>& at_start = nullptr) {
  Configure(shape, timeout_s);
  const int n = shape.ranks();
  InProcessGroup group(n, 1 << 20);
  group.AllowShortReceives();
  group.network().SetShape(shape.local, shape.nodes_per_rack);
  if (prepare) prepare(group);
  // The references, once (every rank compares with them).
  std::vector<std::vector<std::vector<float>>> reference(calls);
  for (int call = 0; call < calls; ++call) {
    for (size_t j = 0; j < kLengths.size(); ++j) {
      std::vector<float> want(kLengths[j]);
      for (int64_t i = 0; i < kLengths[j]; ++i) {
        want[i] = Reference(shape, call * 3 + static_cast<int>(j), i);
      }
      reference[call].push_back(std::move(want));
    }
  }
  Outcome out;
  std::mutex mutex;
  std::vector<std::vector<double>> seconds(n);
  std::atomic<int> finished{0};
  std::atomic<int> ready{0};
  group.Run([&](int r) {
    std::unique_ptr<Context> ctx;
    Status s = Context::Create(std::make_unique<InProcessRank>(group, r), &ctx, Racks(shape, r));
    if (!s.ok()) throw std::runtime_error("context: " + s.message());
    ctx->end_process_on_peer_failure = false;
    if (r == idle_rank) {
      while (finished < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    Engine engine(std::move(ctx));
    // Every rank starts its calls together, so a call's time is the
    // collective's, not the wait for the slowest context.
    if (++ready == n - (idle_rank >= 0) && at_start) {
      at_start(group);
      ++ready;
    }
    while (ready < n - (idle_rank >= 0) + (at_start ? 1 : 0)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (int call = 0; call < calls; ++call) {
      std::vector<std::vector<float>> in(kLengths.size()), result(kLengths.size());
      std::vector<Status> status(kLengths.size());
      // The last done callback wakes this thread (256 threads polling
      // would take the two cores from the ranks they wait for).
      int left = static_cast<int>(kLengths.size());
      std::mutex left_mutex;
      std::condition_variable all_done;
      std::vector<Work> works;
      for (size_t j = 0; j < kLengths.size(); ++j) {
        in[j].resize(kLengths[j]);
        for (int64_t i = 0; i < kLengths[j]; ++i) in[j][i] = Value(r, call * 3 + j, i);
        result[j].assign(kLengths[j], -1.0f);
      }
      // Offered in another order on each rank: negotiation orders them.
      for (size_t k = 0; k < kLengths.size(); ++k) {
        const size_t j = (k + r) % kLengths.size();
        Work w;
        w.name = "t" + std::to_string(call) + "." + std::to_string(j);
        w.collective = Collective::kAllreduce;
        w.dtype = w.wire = DataType::kFloat32;
        w.op = ReduceOp::kSum;
        w.shape = {kLengths[j]};
        w.input = in[j].data();
        w.output = result[j].data();
        w.done = [&, j](const Status& st) {
          status[j] = st;
          std::lock_guard<std::mutex> lock(left_mutex);
          if (--left == 0) all_done.notify_one();
        };
        works.push_back(std::move(w));
      }
      const auto start = Clock::now();
      engine.Enqueue(std::move(works));
      {
        std::unique_lock<std::mutex> lock(left_mutex);
        all_done.wait(lock, [&] { return left == 0; });
      }
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      bool failed = false;
      for (size_t j = 0; j < kLengths.size(); ++j) {
        if (!status[j].ok()) {
          failed = true;
          std::lock_guard<std::mutex> lock(mutex);
          out.failures.push_back(status[j].message());
          continue;
        }
        int bad = 0;
        for (int64_t i = 0; i < kLengths[j]; ++i) {
          bad += std::memcmp(&reference[call][j][i], &result[j][i], sizeof(float)) != 0;
        }
        std::lock_guard<std::mutex> lock(mutex);
        out.mismatches += bad;
        out.ok_tensors += bad == 0;
      }
      if (failed) {
        std::lock_guard<std::mutex> lock(mutex);
        out.fail_seconds.push_back(took);
        break;
      }
      seconds[r].push_back(took);
    }
    // Contexts live until every rank is done: a rank whose engine failed
    // still answers for the others' verdicts, as a process would until it
    // ends (and then it is gone, not silent).
    ++finished;
    while (finished < n - (idle_rank >= 0)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  for (int call = 0; call < calls; ++call) {
    double slowest = 0;
    bool all = true;
    for (int r = 0; r < n; ++r) {
      if (r == idle_rank) continue;
      all = all && static_cast<int>(seconds[r].size()) > call;
      if (all) slowest = std::max(slowest, seconds[r][call]);
    }
    if (all) out.call_seconds.push_back(slowest);
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string Range(const std::vector<double>& v, double scale, const char* unit) {
  if (v.empty()) return "-";
  char text[96];
  std::snprintf(text, sizeof text, "%.3g %s [%.3g-%.3g]", Median(v) * scale, unit,
                *std::min_element(v.begin(), v.end()) * scale,
                *std::max_element(v.begin(), v.end()) * scale, unit);
  return text;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void Results() {
  for (const Shape& shape : {Shape{2, 8, 4}, Shape{1, 16, 8}, Shape{4, 32, 1}, Shape{4, 16, 4},
                             Shape{1, 64, 4}}) {
    const auto start = Clock::now();
    const Outcome o = Run(shape, 3, 10);
    Expect(o.failures.empty(), shape.Name() + ": every call succeeds" +
                                   (o.failures.empty() ? "" : ": " + o.failures[0]));
    Expect(o.mismatches == 0 && o.ok_tensors == shape.ranks() * 3 * 3,
           shape.Name() + ": every rank's bits are the reference's in the promised order (" +
               std::to_string(o.mismatches) + " elements differ)");
    std::printf("%s: %s per call; %.1f s in all\n", shape.Name().c_str(),
                Range(o.call_seconds, 1e3, "ms").c_str(),
                std::chrono::duration<double>(Clock::now() - start).count());
    std::fflush(stdout);
  }
}

// A sanitizer build runs the 256 thread-ranks several times slower, and
// set-up alone passed 0.5 s on two busy cores: SCALE_CHECK_SLOWDOWN
// (tests/core/test_core_sanitizers.py sets it) stretches every time of the
// timing cases by its factor (timeouts, rates, stalls and the bounds on
// verdicts), so the relations between them that each case tests stay.
double Slowdown() {
  const char* value = std::getenv("SCALE_CHECK_SLOWDOWN");
  const double factor = value ? std::atof(value) : 1.0;
  return factor >= 1.0 ? factor : 1.0;
}
const double kStretch = Slowdown();
const double kTimeout = 0.5 * kStretch;
const Shape kWide{4, 64, 1};

void SlowButMoving() {
  // About 130 KB cross each rack's uplink per direction in each of the
  // call's two stages there, in messages that share it and finish
  // together: at 130 KB/s, moving 0.5 s of every 2 s, a stage completes
  // nothing for about 4 s, longer than the pipeline's polling (1 s) and
  // the peer timeout together. The stalls (1.5 s) outlast the judge's
  // window (a quarter of the 2 s timeout, plus the time 256 threads on 2
  // cores take to survey each other) but not the timeout: a judge that
  // took one quiet window for a hang ended these calls. They start once
  // every context is built (set-up waits have no judge).
  const double kSlowTimeout = 2.0 * kStretch;
  const Outcome o = Run(
      kWide, 1, kSlowTimeout,
      [](InProcessGroup& g) {
        g.network().SetRates(ddl_test::Network::kInstant, 130e3 / kStretch);
      },
      -1, [](InProcessGroup& g) { g.network().SetStalls(2.0 * kStretch, 1.5 * kStretch); });
  Expect(o.failures.empty(), "slow but moving, with stalls: no call fails" +
                                 (o.failures.empty() ? "" : ": " + o.failures[0]));
  Expect(o.mismatches == 0 && o.ok_tensors == kWide.ranks() * 3,
         "slow but moving, with stalls: every rank's bits are the reference's");
  Expect(!o.call_seconds.empty() && Median(o.call_seconds) > 2 * kSlowTimeout,
         "slow but moving, with stalls: a call outlasts the peer timeout (" +
             Range(o.call_seconds, 1, "s") + ")");
  std::printf("slow but moving, with stalls, %s: %s per call\n", kWide.Name().c_str(),
              Range(o.call_seconds, 1, "s").c_str());
}

Outcome SilentNode(const Shape& shape, int calls = 1) {
  return Run(shape, calls, kTimeout, [&shape](InProcessGroup& g) {
    g.network().Silence(shape.nodes_per_rack * shape.racks / 2 + 1);
  });
}

void Silent() {
  const Outcome o = SilentNode(kWide);
  Expect(static_cast<int>(o.fail_seconds.size()) == kWide.ranks(),
         "silent: every rank's call fails (" + std::to_string(o.fail_seconds.size()) + " of " +
             std::to_string(kWide.ranks()) + ")");
  int said = 0;
  std::string other;
  for (const std::string& m : o.failures) {
    const bool hangs = Contains(m, "lost contact in a data transfer") &&
                       Contains(m, "no rank's transfers moved a byte") &&
                       Contains(m, "none died or was cut off, so a collective hangs");
    said += hangs;
    if (!hangs) other = m;
  }
  Expect(said == static_cast<int>(o.failures.size()) && said > 0,
         "silent: every report says a collective hangs with nothing moving (" +
             std::to_string(said) + " of " + std::to_string(o.failures.size()) + ")" +
             (other.empty() ? "" : "; another: " + other));
  const double slowest =
      o.fail_seconds.empty() ? 0 : *std::max_element(o.fail_seconds.begin(), o.fail_seconds.end());
  Expect(slowest < 20 * kTimeout + 10, "silent: every verdict within a few timeouts (slowest " +
                                           std::to_string(slowest) + " s)");
  std::printf("silent node, %s: verdicts %s after the call began\n", kWide.Name().c_str(),
              Range(o.fail_seconds, 1, "s").c_str());
}

void Stopped() {
  const Shape shape{4, 16, 4};
  const int idle = 201;
  const Outcome o = Run(shape, 1, kTimeout, nullptr, idle);
  Expect(static_cast<int>(o.fail_seconds.size()) == shape.ranks() - 1,
         "stopped: every other rank's call fails (" + std::to_string(o.fail_seconds.size()) + ")");
  int named = 0;
  for (const std::string& m : o.failures) {
    // "Rank(s) [..] answer but made no progress": rank 201 among them (a
    // rank that gave up a moment earlier may be listed too).
    const size_t list = m.find("Rank(s) [");
    const std::string ranks =
        list == std::string::npos ? "" : "," + m.substr(list + 9, m.find(']', list) - list - 9) + ",";
    named += Contains(m, "lost contact in negotiation") &&
             Contains(m, "] answer but made no progress") &&
             (Contains(ranks, ",201,") || Contains(ranks, " 201,"));
  }
  Expect(named == static_cast<int>(o.failures.size()) && named > 0,
         "stopped: every report names rank 201 as answering without progress (" +
             std::to_string(named) + " of " + std::to_string(o.failures.size()) + ")" +
             (o.failures.empty() ? "" : ": " + o.failures[0]));
  std::printf("stopped engine, %s: verdicts %s after the call began\n", shape.Name().c_str(),
              Range(o.fail_seconds, 1, "s").c_str());
}

// The docs' table (docs/failures.md): per rank count, calls of the three
// tensors on 4 racks of 4-rank nodes, and the silent node's verdicts; one
// line per rank count, "table ranks=N shape=RxNxL" and the figures (the
// time per call over the calls, the verdict over the ranks).
void Table(int calls) {
  for (int n : {64, 128, 256}) {
    const Shape shape{4, n / 16, 4};
    const Outcome ok = Run(shape, calls, 10);
    const Outcome silent = SilentNode(shape);
    auto stats = [](const std::vector<double>& v, double scale) {
      if (v.empty()) return std::string("nan nan nan");
      char text[96];
      std::snprintf(text, sizeof text, "%.4g %.4g %.4g", Median(v) * scale,
                    *std::min_element(v.begin(), v.end()) * scale,
                    *std::max_element(v.begin(), v.end()) * scale);
      return std::string(text);
    };
    std::printf("table ranks=%d shape=%dx%dx%d calls=%zu call_ms(median,min,max)= %s "
                "verdicts=%zu verdict_s(median,min,max)= %s\n",
                n, shape.racks, shape.nodes_per_rack, shape.local, ok.call_seconds.size(),
                stats(ok.call_seconds, 1e3).c_str(), silent.fail_seconds.size(),
                stats(silent.fail_seconds, 1).c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (only == "--shape" && argc == 6) {  // one shape's calls: racks nodes local calls
    const Shape shape{std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4])};
    const Outcome o = Run(shape, std::atoi(argv[5]), 10);
    std::printf("%s: %s per call, %zu failures, %d elements differ\n", shape.Name().c_str(),
                Range(o.call_seconds, 1e3, "ms").c_str(), o.failures.size(), o.mismatches);
    return 0;
  }
  if (only == "--table") {
    Table(argc > 2 ? std::atoi(argv[2]) : 7);
    return 0;
  }
  const std::vector<std::pair<std::string, void (*)()>> checks = {
      {"results", Results}, {"slow", SlowButMoving}, {"silent", Silent}, {"stopped", Stopped}};
  return ddl_test::RunNamedChecks(checks, only);
}
