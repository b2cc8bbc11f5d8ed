// DDL_AUTOTUNE (custom_ops/tuning/autotune.h) with threads as ranks
// (tests/core/in_process.h). A hook replaces the measured times by
// injected ones, so the decision is known in advance:
//   decide   - 2 and 3 ranks: the slowest rank's time per sample and the
//              median over samples pick the candidate (min over ranks, or
//              the mean, would pick another); every rank gets rank 0's
//              choice at the same batch, though each rank's own times
//              point elsewhere; the table is printed once, by rank 0;
//              a candidate capped at a size class (the one-round
//              exchanges) is not tried above it, and the table says so;
//   file     - the table saved by rank 0 is loaded by the next run of the
//              same shape (nothing measured), refused with a warning for
//              another shape (measured again);
//   settings - 2 and 3 ranks: the fusion threshold and cycle time, by
//              windows of cycles after the algorithms; the slowest rank's
//              bytes per second per window and the median over windows
//              pick the setting (min over ranks, rank 0's own times or the
//              mean would pick others); every rank runs the same setting
//              in every cycle and switches at the same cycle; the one
//              table has the settings' rows; the saved table round-trips
//              both parts, and a v1 table, one of other settings and one
//              of another shape are refused with a warning and measured;
//   engine   - whole Engines (flat over 3 ranks, and 2 nodes x 2 local
//              ranks through shared memory) with DDL_AUTOTUNE=1: results
//              bitwise equal on every rank and equal to the rank-order sum
//              before, during and after the switches to the tuned
//              algorithm and the tuned fusion threshold (which batches
//              the calls' two tensors differently), applied on every rank.
// Prints one line per failure and "<N> checks, <F> failures".
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "check.h"
#include "tuning/autotune.h"
#include "engine/engine.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

std::string R(int rank) { return " (rank " + std::to_string(rank) + ")"; }
bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<AutotuneCandidate> TwoCandidates() {
  return {{"DIRECT_EXCHANGE_ALLREDUCE", NetworkChoice::kDirectExchange},
          {"PAIRWISE_RING_ALLREDUCE", NetworkChoice::kPairwiseRing}};
}

constexpr size_t kSmall = 1 << 10;       // class 0
constexpr size_t kLarge = 2 << 20;       // class 2
constexpr int kSteps = 3;

// Injected times (ms), chosen so that each rule picks differently:
//   class 0: candidate 0 is fast on rank 0 (1) and slow on the last rank
//            (10); candidate 1 takes 3 everywhere. Slowest rank: 1 wins;
//            fastest rank (min): 0 would; rank 0 alone: 0.
//   class 2: candidate 0 takes 2 everywhere, candidate 1 takes 0.5 on
//            rank 0 and 4 elsewhere. Slowest: 0 wins; min: 1 would.
//            One sample of candidate 0 is an outlier of 50 on the last
//            rank: the median ignores it, a mean (19.3) would pick 1.
double Injected(int ranks, int rank, int c, int k, int sample) {
  const bool last = rank == ranks - 1;
  if (c == 0) return k == 0 ? (last ? 10 : 1) : 3;
  if (c == 2) {
    if (k == 0) return last && sample == 1 ? 50 : 2;
    return rank == 0 ? 0.5 : 4;
  }
  return 7;
}

// Runs a tuner per rank over `ranks` threads; batches alternate small and
// large. Returns, per rank, the batch index at which it was decided, and
// fills each rank's final choices and what rank r printed.
struct RunResult {
  std::vector<int> decided_at;
  std::vector<std::vector<int>> chosen;
  std::vector<std::string> printed;
  std::vector<int> measured;  // batches that carried a measurement, per rank
  std::vector<NetworkChoice> small_after, large_after, unseen_after;
};

// `shapes`, if given, is each rank's own view of the shape.
RunResult RunTuners(int ranks, const std::string& shape, const std::vector<std::string>& files,
                    int batches, const std::vector<std::string>* shapes = nullptr,
                    std::vector<AutotuneCandidate> candidates = TwoCandidates()) {
  InProcessGroup group(ranks, 1 << 20);
  RunResult out;
  out.decided_at.assign(ranks, -1);
  out.chosen.resize(ranks);
  out.printed.resize(ranks);
  out.measured.assign(ranks, 0);
  out.small_after.resize(ranks);
  out.large_after.resize(ranks);
  out.unseen_after.resize(ranks);
  group.Run([&](int r) {
    InProcessRank plane(group, r);
    Autotuner tuner(plane, candidates, kSteps, "world", shapes ? (*shapes)[r] : shape,
                    files[r],
                    [&out, r](const std::string& text) { out.printed[r] += text; });
    for (int b = 0; b < batches; ++b) {
      Autotuner::Ticket t;
      // An empty batch now and then: nothing crosses the network, nothing
      // is measured, the plan goes on.
      if (b % 5 == 4) {
        Expect(tuner.Before(0, &t) == NetworkChoice::kAuto && t.candidate < 0,
               "an empty batch is not measured" + R(r));
        tuner.After(t, 5.0);
      }
      tuner.Before(b % 2 ? kLarge : kSmall, &t);
      if (t.candidate >= 0) ++out.measured[r];
      tuner.After(t, 1e-3);
      if (tuner.decided() && out.decided_at[r] < 0) out.decided_at[r] = b;
    }
    out.chosen[r] = tuner.table().chosen;
    Autotuner::Ticket t;
    out.small_after[r] = tuner.Before(kSmall, &t);
    out.large_after[r] = tuner.Before(kLarge, &t);
    out.unseen_after[r] = tuner.Before(200 << 10, &t);
  });
  return out;
}

void InjectTimes(int ranks) {
  SetAutotuneTimeHook([ranks](int rank, int c, int k, int sample, double) {
    return Injected(ranks, rank, c, k, sample) * 1e-3;
  });
}

void DecisionFromTheSlowestRank() {
  for (int ranks : {2, 3}) {
    const std::string n = " (" + std::to_string(ranks) + " ranks)";
    InjectTimes(ranks);
    RunResult res = RunTuners(ranks, "test", std::vector<std::string>(ranks), 40);
    for (int r = 0; r < ranks; ++r) {
      // 2 classes x 2 candidates x kSteps samples; decided after the
      // batch that completes them: batch 4 x kSteps - 1.
      Expect(res.decided_at[r] == 4 * kSteps - 1,
             "decided after the last measured batch" + n + R(r) + ": batch " +
                 std::to_string(res.decided_at[r]));
      Expect(res.measured[r] == 4 * kSteps, "measured batches" + n + R(r));
      Expect(res.chosen[r].size() == 5 && res.chosen[r][0] == 1,
             "class 0: the slowest rank's times choose candidate 1" + n + R(r));
      Expect(res.chosen[r].size() == 5 && res.chosen[r][2] == 0,
             "class 2: the slowest rank's median chooses candidate 0" + n + R(r));
      Expect(res.chosen[r].size() == 5 && res.chosen[r][1] == -1 && res.chosen[r][3] == -1 &&
                 res.chosen[r][4] == -1,
             "classes without traffic keep the size rule" + n + R(r));
      Expect(res.chosen[r] == res.chosen[0], "every rank has rank 0's choice" + n + R(r));
      Expect(res.small_after[r] == NetworkChoice::kPairwiseRing &&
                 res.large_after[r] == NetworkChoice::kDirectExchange &&
                 res.unseen_after[r] == NetworkChoice::kAuto,
             "after the decision Before() returns the chosen algorithm" + n + R(r));
      const bool table = Contains(res.printed[r], "keras_ddl autotune:");
      Expect(r == 0 ? table : res.printed[r].empty(), "only rank 0 prints" + n + R(r));
    }
    const std::string& p = res.printed[0];
    Expect(p.find("keras_ddl autotune:") == p.rfind("keras_ddl autotune:"),
           "one table" + n + ":\n" + p);
    Expect(Contains(p, "10.000 ms") && Contains(p, "3.000 ms") && Contains(p, "2.000 ms") &&
               Contains(p, "4.000 ms"),
           "the table shows the slowest rank's medians" + n + ":\n" + p);
    Expect(Contains(p, "(no batch of this size while tuning: size rule)"),
           "the table names the classes not seen" + n + ":\n" + p);
    // Decide on its own: max over ranks, median over samples.
    Autotuner::Samples a(5, std::vector<std::vector<double>>(2)), b = a;
    a[0][0] = {1, 1, 1};
    b[0][0] = {5, 2, 9};
    a[0][1] = {3, 3, 3};
    b[0][1] = {3, 4, 3};
    AutotuneTable t = Autotuner::Decide({a, b}, 2);
    Expect(t.median[0][0] == 5 && t.median[0][1] == 3 && t.chosen[0] == 1,
           "Decide: median of per-sample maxima");
  }
  SetAutotuneTimeHook(nullptr);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void SavedTableIsReused() {
  constexpr int ranks = 3;
  char dir_template[] = "/tmp/ddl_autotune_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string file = dir + "/table.txt";
  // Only rank 0's file counts (the others have none).
  const std::vector<std::string> files = {file, "", ""};
  InjectTimes(ranks);
  RunResult first = RunTuners(ranks, "ranks=3 step=world", files, 40);
  const std::string saved = ReadAll(file);
  Expect(Contains(saved, "keras_ddl autotune table v2") && Contains(saved, "shape ranks=3"),
         "rank 0 saved the table:\n" + saved);
  Expect(access((file + ".tmp." + std::to_string(getpid())).c_str(), F_OK) != 0,
         "no temporary file is left behind");
  // The next run of the same shape: times that would choose otherwise.
  SetAutotuneTimeHook([](int, int c, int k, int, double) { return (k == 0 ? 1 : 9) * 1e-3 + c; });
  RunResult again = RunTuners(ranks, "ranks=3 step=world", files, 40);
  for (int r = 0; r < ranks; ++r) {
    Expect(again.decided_at[r] == 0 && again.measured[r] == 0,
           "a saved table of this shape is used from the first batch" + R(r));
    Expect(again.chosen[r] == first.chosen[0], "the loaded choice is the saved one" + R(r));
  }
  Expect(Contains(again.printed[0], "keras_ddl autotune:") &&
             Contains(again.printed[0], "loaded from " + file),
         "rank 0 prints the loaded table:\n" + again.printed[0]);
  Expect(Contains(again.printed[0], "10.000 ms"), "the loaded table has the saved medians");
  // Another shape: a warning, then measured again (with the new times).
  RunResult other = RunTuners(ranks, "ranks=3 step=cross-node", files, 40);
  Expect(Contains(other.printed[0], "warning: not using DDL_AUTOTUNE_FILE=" + file) &&
             Contains(other.printed[0], "another job shape (ranks=3 step=world; this job: "
                                        "ranks=3 step=cross-node)"),
         "a table of another shape is refused, naming both shapes:\n" + other.printed[0]);
  for (int r = 0; r < ranks; ++r) {
    Expect(other.measured[r] == 4 * kSteps && other.chosen[r][0] == 0 && other.chosen[r][2] == 0,
           "another shape measures again" + R(r));
  }
  Expect(Contains(ReadAll(file), "shape ranks=3 step=cross-node"),
         "and saves the new table over the old");
  // Nodes of different sizes: each rank sees another local size, rank 0's
  // shape counts, and every rank takes its table (loaded, then measured).
  const std::vector<std::string> uneven = {"ranks=3 step=cross-node", "ranks=3 local=7",
                                           "ranks=3 local=9"};
  RunResult mixed = RunTuners(ranks, "", files, 40, &uneven);
  for (int r = 0; r < ranks; ++r) {
    Expect(mixed.decided_at[r] == 0 && mixed.chosen[r] == other.chosen[0],
           "ranks that see another shape take rank 0's loaded table" + R(r));
  }
  std::remove(file.c_str());
  mixed = RunTuners(ranks, "", files, 40, &uneven);
  for (int r = 0; r < ranks; ++r) {
    Expect(mixed.decided_at[r] == 4 * kSteps - 1 && mixed.chosen[r] == other.chosen[0],
           "and rank 0's measured decision" + R(r));
  }
  // A table that chose what this build no longer tries at that size (a
  // one-round exchange for 1-8 MiB batches, saved before the exchanges
  // were capped below 1 MiB): refused, naming the file, and measured
  // again. The saved table chose candidate 0 for class 2 (InjectTimes).
  InjectTimes(ranks);
  RunResult uncapped = RunTuners(ranks, "ranks=3 step=world", files, 40);
  Expect(uncapped.chosen[0][2] == 0, "the uncapped run chose candidate 0 for class 2");
  std::vector<AutotuneCandidate> capped = TwoCandidates();
  capped[0].max_class = 1;
  RunResult stale = RunTuners(ranks, "ranks=3 step=world", files, 40, nullptr, capped);
  Expect(Contains(stale.printed[0], "warning: not using DDL_AUTOTUNE_FILE=" + file +
                                        ": it chose DIRECT_EXCHANGE_ALLREDUCE for batches of "
                                        "1 - 8 MiB, which this keras_ddl no longer tries at "
                                        "that size; measuring again"),
         "a table choosing a capped candidate above its cap is refused:\n" + stale.printed[0]);
  for (int r = 0; r < ranks; ++r) {
    Expect(stale.measured[r] > 0 && stale.chosen[r][2] == 1,
           "and the job measures again, choosing a candidate tried there" + R(r));
  }
  // A malformed file: refused, measured.
  {
    std::ofstream bad(file, std::ios::trunc);
    bad << "keras_ddl autotune table v2\nshape ranks=3 step=world\nrubbish\n";
  }
  RunResult broken = RunTuners(ranks, "ranks=3 step=world", files, 40);
  Expect(Contains(broken.printed[0], "warning: not using") && broken.measured[0] == 4 * kSteps,
         "a malformed file is refused and the job measures:\n" + broken.printed[0]);
  SetAutotuneTimeHook(nullptr);
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

// The settings' phase, over threads as ranks. Three settings; windows of
// kCycles cycles; each cycle runs one batch (alternately small and large,
// so every window moves the same bytes).
constexpr int kCycles = 2;
std::vector<AutotuneSetting> ThreeSettings() { return {{128, 1}, {4, 1}, {128, 5}}; }

// Injected window seconds (ms), chosen so that each rule picks differently:
//   setting 0: 2 everywhere;
//   setting 1: 1.5 everywhere but one window of 50 on the last rank (the
//              median ignores it; a mean, 17.7, would pick setting 0);
//   setting 2: 1 on rank 0, 3 elsewhere (slowest 3; fastest rank and
//              rank 0 alone: 1, the best).
// The slowest rank's median picks setting 1, not the last window's
// setting (2): a rank that switched a cycle late would show.
double InjectedWindow(int ranks, int rank, int k, int sample) {
  const bool last = rank == ranks - 1;
  if (k == 0) return 2;
  if (k == 1) return last && sample == 1 ? 50 : 1.5;
  return rank == 0 ? 1 : 3;
}

struct SettingsRun {
  std::vector<std::vector<AutotuneSetting>> used;  // [rank][cycle]
  // What each rank had printed when the algorithms were chosen.
  std::vector<std::string> printed_when_algorithms_chosen;
  std::vector<int> settings_decided_at;
  std::vector<AutotuneTable> table;
  std::vector<std::string> printed;
  std::atomic<int> windows_measured{0};
};

void RunSettingsTuners(int ranks, const std::string& shape, const std::vector<std::string>& files,
                       int cycles, SettingsRun* out,
                       std::vector<AutotuneSetting> settings = ThreeSettings()) {
  InProcessGroup group(ranks, 1 << 20);
  out->used.assign(ranks, {});
  out->settings_decided_at.assign(ranks, -1);
  out->table.assign(ranks, {});
  out->printed.assign(ranks, "");
  out->printed_when_algorithms_chosen.assign(ranks, "(never chosen)");
  group.Run([&](int r) {
    InProcessRank plane(group, r);
    // Each rank's own cycle time in its first candidate: rank 0's list is
    // every rank's.
    std::vector<AutotuneSetting> mine = settings;
    if (r > 0) mine[0].cycle_time_ms *= 3;
    {
      Autotuner tuner(plane, TwoCandidates(), kSteps, "world", shape, files[r],
                      [out, r](const std::string& text) { out->printed[r] += text; });
      tuner.TuneSettings(mine, kCycles);
      for (int c = 0; c < cycles; ++c) {
        const size_t bytes = c % 2 ? kLarge : kSmall;
        out->used[r].push_back(tuner.BeginCycle(bytes));
        if (tuner.settings_decided() && out->settings_decided_at[r] < 0) {
          out->settings_decided_at[r] = c;
        }
        Autotuner::Ticket t;
        const bool decided = tuner.decided();
        tuner.Before(bytes, &t);
        tuner.After(t, 1e-3);
        if (!decided && tuner.decided()) out->printed_when_algorithms_chosen[r] = out->printed[r];
      }
      out->table[r] = tuner.table();
    }
  });
}

void InjectWindows(int ranks, std::atomic<int>* measured) {
  SetAutotuneWindowHook([ranks, measured](int rank, int k, int sample, double) {
    ++*measured;
    return InjectedWindow(ranks, rank, k, sample) * 1e-3;
  });
}

void SettingsFromTheSlowestRank() {
  for (int ranks : {2, 3}) {
    const std::string n = " (" + std::to_string(ranks) + " ranks)";
    InjectTimes(ranks);
    SettingsRun res;
    InjectWindows(ranks, &res.windows_measured);
    constexpr int kCyclesRun = 40;
    RunSettingsTuners(ranks, "test", std::vector<std::string>(ranks), kCyclesRun, &res);
    // The algorithms take 4 x kSteps cycles (one batch each); then 3
    // settings x kSteps windows of kCycles cycles; the next cycle closes
    // the last window and runs the choice.
    const int first = 4 * kSteps, switch_at = first + 3 * kSteps * kCycles;
    const std::vector<AutotuneSetting> s = ThreeSettings();
    std::vector<AutotuneSetting> want;
    for (int c = 0; c < kCyclesRun; ++c) {
      want.push_back(c < first       ? s[0]
                     : c < switch_at ? s[((c - first) / kCycles) % 3]
                                     : s[1]);
    }
    for (int r = 0; r < ranks; ++r) {
      Expect(res.used[r] == want, "the setting of every cycle, rank 0's list" + n + R(r));
      Expect(res.settings_decided_at[r] == switch_at,
             "the settings switch at the cycle that closes the last window" + n + R(r) + ": " +
                 std::to_string(res.settings_decided_at[r]));
      Expect(res.table[r].setting_chosen == 1,
             "the slowest rank's median picks setting 1" + n + R(r) + ": " +
                 std::to_string(res.table[r].setting_chosen));
      Expect(res.table[r].chosen[0] == 1 && res.table[r].chosen[2] == 0,
             "the algorithms are chosen as before" + n + R(r));
      const bool table = Contains(res.printed[r], "keras_ddl autotune:");
      Expect(r == 0 ? table : res.printed[r].empty(), "only rank 0 prints" + n + R(r));
    }
    Expect(res.windows_measured == ranks * 3 * kSteps, "every window measured once" + n);
    // Scores: bytes per window over the slowest rank's seconds.
    const double bytes = kSmall + kLarge;
    const std::vector<double>& score = res.table[0].setting_score;
    Expect(score.size() == 3 && score[0] == bytes / 2e-3 && score[1] == bytes / 1.5e-3 &&
               score[2] == bytes / 3e-3,
           "the scores are the slowest rank's bytes per second" + n);
    // The algorithms' table comes when they are chosen, with what the
    // settings' phase will take; the settings' rows come at its end.
    const std::string& early = res.printed_when_algorithms_chosen[0];
    const std::string next = "next: 3 fusion thresholds and cycle times, " +
                             std::to_string(kSteps) + " windows of " + std::to_string(kCycles) +
                             " cycles each: the next " +
                             std::to_string(3 * kSteps * kCycles) + " cycles that run allreduces";
    Expect(Contains(early, "keras_ddl autotune: the world step's allreduce (test), measured ") &&
               Contains(early, "  < 64 KiB") && Contains(early, next) &&
               !Contains(early, "fusion threshold  "),
           "the algorithms' table is printed when they are chosen" + n + ":\n" + early);
    for (int r = 1; r < ranks; ++r) {
      Expect(res.printed_when_algorithms_chosen[r].empty(), "only rank 0 prints" + n + R(r));
    }
    const std::string& p = res.printed[0];
    const std::string late = p.substr(early.size());
    Expect(Contains(late, "keras_ddl autotune: the world step's fusion threshold and cycle time "
                          "(test), measured ") &&
               late.find("keras_ddl autotune:") == late.rfind("keras_ddl autotune:") &&
               !Contains(late, "< 64 KiB"),
           "then the settings' table alone" + n + ":\n" + p);
    auto row = [&p](const std::string& start) {
      const size_t at = p.find("\n  " + start);
      return at == std::string::npos ? std::string("(missing)")
                                     : p.substr(at + 1, p.find('\n', at + 1) - at - 1);
    };
    char mibs[64];
    std::snprintf(mibs, sizeof mibs, "%.3f MiB/s", bytes / 1.5e-3 / (1 << 20));
    Expect(Contains(row("4 MB              1 ms"), mibs) &&
               row("4 MB              1 ms").back() == '*',
           "the table's chosen row, with its score" + n + ":\n" + p);
    Expect(Contains(row("128 MB            1 ms"), "(configured)") &&
               row("128 MB            1 ms").back() != '*' &&
               row("128 MB            5 ms").back() != '*',
           "the configured row and the other, not chosen" + n + ":\n" + p);
    Expect(Contains(late, "measured " + std::to_string(kSteps) + " windows of " +
                              std::to_string(kCycles) + " cycles per setting"),
           "the table says what was measured" + n + ":\n" + p);
  }
  {
    // A job that stops during the settings' phase: the algorithms were
    // shown, and the last words say how far it got and what would finish.
    InjectTimes(2);
    SettingsRun cut;
    InjectWindows(2, &cut.windows_measured);
    const int cycles = 4 * kSteps + 7;  // 7 cycles into the settings
    RunSettingsTuners(2, "test", std::vector<std::string>(2), cycles, &cut);
    const std::string& p = cut.printed[0];
    Expect(Contains(cut.printed_when_algorithms_chosen[0], "  next: 3 fusion thresholds") &&
               Contains(p, "keras_ddl autotune: the job ended before tuning finished (the "
                           "algorithms were chosen, as printed above; 7 of the " +
                           std::to_string(3 * kSteps * kCycles) +
                           " cycles of the fusion threshold and cycle time had run); nothing "
                           "saved. A longer job, or fewer DDL_AUTOTUNE_STEPS or "
                           "DDL_AUTOTUNE_CYCLES, lets it finish\n"),
           "a job cut short in the settings' phase says how far it got:\n" + p);
  }
  // DecideSettings on its own: max over ranks, median over windows,
  // bytes per second (not seconds alone).
  AutotuneTable t;
  Autotuner::DecideSettings({{{1, 1, 1}, {1, 1, 1}}, {{2, 2, 2}, {1.5, 9, 1.5}}},
                            {{4, 4, 4}, {2, 2, 2}}, &t);
  Expect(t.setting_score.size() == 2 && t.setting_score[0] == 2 && t.setting_score[1] == 2 / 1.5,
         "DecideSettings: median of bytes over the slowest rank's seconds");
  Expect(t.setting_chosen == 0, "DecideSettings: the most bytes per second, not the least time");
  Autotuner::DecideSettings({{{1}, {1}}}, {{3}, {3}}, &t);
  Expect(t.setting_chosen == 0, "DecideSettings: a tie keeps the first (configured) setting");
  SetAutotuneWindowHook(nullptr);
  SetAutotuneTimeHook(nullptr);
}

void SavedSettingsAreReused() {
  constexpr int ranks = 3;
  char dir_template[] = "/tmp/ddl_autotune_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string file = dir + "/table.txt";
  const std::vector<std::string> files = {file, "", ""};
  const std::string shape = "ranks=3 step=world";
  InjectTimes(ranks);
  SettingsRun first;
  InjectWindows(ranks, &first.windows_measured);
  RunSettingsTuners(ranks, shape, files, 40, &first);
  const std::string saved = ReadAll(file);
  Expect(Contains(saved, "keras_ddl autotune table v2\n") &&
             Contains(saved, "\nsettings 128MB/1ms 4MB/1ms 128MB/5ms\n") &&
             Contains(saved, "\nsettings_chosen 1 median_bytes_per_second "),
         "rank 0 saved both parts of the table:\n" + saved);
  // The next run of the same shape: window times that would choose
  // setting 2 if measured.
  SettingsRun again;
  SetAutotuneWindowHook([&again](int, int k, int, double) {
    ++again.windows_measured;
    return k == 2 ? 1e-3 : 1.0;
  });
  RunSettingsTuners(ranks, shape, files, 10, &again);
  for (int r = 0; r < ranks; ++r) {
    Expect(again.settings_decided_at[r] == 0 && again.table[r].setting_chosen == 1 &&
               again.used[r] == std::vector<AutotuneSetting>(10, ThreeSettings()[1]),
           "the saved setting is every rank's from the first cycle" + R(r));
    const std::vector<double>& a = again.table[r].setting_score;
    const std::vector<double>& b = first.table[0].setting_score;
    bool close = a.size() == b.size();
    for (size_t k = 0; close && k < a.size(); ++k) close = std::fabs(a[k] - b[k]) <= 1e-8 * b[k];
    Expect(close, "the loaded scores are the saved ones" + R(r));
  }
  Expect(again.windows_measured == 0, "nothing measured with a saved table");
  Expect(Contains(again.printed[0], "loaded from " + file) &&
             again.printed[0].find("keras_ddl autotune:") ==
                 again.printed[0].rfind("keras_ddl autotune:"),
         "rank 0 prints the loaded table once:\n" + again.printed[0]);
  auto refused = [&](const std::string& why, const std::string& text_shape,
                     std::vector<AutotuneSetting> settings) {
    SettingsRun run;
    InjectWindows(ranks, &run.windows_measured);
    RunSettingsTuners(ranks, text_shape, files, 40, &run, settings);
    Expect(Contains(run.printed[0], "warning: not using DDL_AUTOTUNE_FILE=" + file + ": " + why),
           "refused: " + why + ":\n" + run.printed[0]);
    Expect(run.windows_measured == ranks * 3 * kSteps && run.settings_decided_at[0] > 0,
           "and measured again: " + why);
  };
  // A table of v1, as an earlier keras_ddl saved it: its algorithms alone.
  {
    std::string v1 = saved.substr(0, saved.find("\nsettings ") + 1);
    v1.replace(0, v1.find('\n'), "keras_ddl autotune table v1");
    std::ofstream out(file, std::ios::trunc);
    out << v1;
  }
  refused("it is a table of an earlier keras_ddl (v1), without the fusion threshold and cycle "
          "time; measuring again", shape, ThreeSettings());
  Expect(Contains(ReadAll(file), "keras_ddl autotune table v2\n"), "and saved as v2");
  // A table cut short (its last line lost) and one with bytes after its
  // end (two saves run together): each refused, naming the file, and
  // measured again; the measurement saves a whole table over it.
  const std::string whole = ReadAll(file);
  {
    std::ofstream out(file, std::ios::trunc);
    out << whole.substr(0, whole.rfind('\n', whole.size() - 2) + 1);
  }
  refused("it ends early; measuring again", shape, ThreeSettings());
  const std::string resaved = ReadAll(file);
  Expect(Contains(resaved, "keras_ddl autotune table v2\n"), "saved whole again");
  {
    std::ofstream out(file, std::ios::trunc);
    out << resaved << "settings_chosen 0\n";
  }
  refused("it has bytes after its last line; measuring again", shape, ThreeSettings());
  refused("it has other fusion thresholds and cycle times (settings 128MB/1ms 4MB/1ms "
          "128MB/5ms; this job: settings 64MB/1ms 4MB/1ms 128MB/5ms)",
          shape, {{64, 1}, {4, 1}, {128, 5}});
  refused("it was measured for another job shape", "ranks=3 step=racks",
          {{64, 1}, {4, 1}, {128, 5}});
  SetAutotuneWindowHook(nullptr);
  SetAutotuneTimeHook(nullptr);
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

// Whole engines: many allreduces of two sizes, each of values that make
// the rank-order sum matter, through measuring, the decision and after.
class Env {
 public:
  Env(const char* k, const char* v) : k_(k) { setenv(k, v, 1); }
  ~Env() { unsetenv(k_); }

 private:
  const char* k_;
};

float Value(int rank, int call, int64_t i) {
  // Different magnitudes: (x0 + x1) + x2 != x0 + (x1 + x2) in float.
  const uint32_t h = static_cast<uint32_t>((rank + 1) * 2654435761u ^ (call * 40503u) ^
                                           static_cast<uint32_t>(i * 97));
  return std::ldexp(static_cast<float>(h % 100000) / 7.0f, static_cast<int>(rank * 9) - 9);
}

void EnginesThroughTheSwitch(int ranks, const char* local_size, const std::string& what) {
  char dir_template[] = "/tmp/ddl_autotune_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string file = dir + "/table.txt";
  // Windows of one cycle; a threshold of 0.25 MB keeps the calls' two
  // tensors in two batches when the first is large, 4 MB (candidate 1,
  // made the fastest) fuses them.
  Env a("DDL_AUTOTUNE", "1"), b("DDL_AUTOTUNE_STEPS", "2"), c("DDL_LOCAL_SIZE", local_size),
      d("DDL_AUTOTUNE_FILE", file.c_str()), e("DDL_AUTOTUNE_CYCLES", "1"),
      f("DDL_FUSION_THRESHOLD_MB", "0.25");
  SetAutotuneWindowHook([](int, int k, int, double) { return k == 1 ? 1e-3 : 2e-3; });
  // Candidate 1 (pairwise + ring) is made fastest for small batches, which
  // the size rule gives to the direct exchange: the switch changes the
  // algorithm of small batches.
  SetAutotuneTimeHook([](int, int c, int k, int, double) { return (k == 1 ? 1 : 2) * 1e-3 + c; });
  InProcessGroup group(ranks, 1 << 16);
  constexpr int kCalls = 32;
  // Each call: tensor A of sizes[call % 2] floats (classes 0 and 1) and B
  // of 3000 floats. Under 0.25 MB a large A and B are two batches, under
  // 4 MB one.
  const std::vector<int64_t> sizes = {301, 70000};
  constexpr int64_t kB = 3000;
  auto length = [&sizes](int call, int j) { return j == 0 ? sizes[call % 2] : kB; };
  std::vector<std::vector<std::vector<float>>> out(ranks);  // [rank][2 call + j]
  std::vector<AutotuneSetting> in_force(ranks);
  std::mutex errors_mutex;
  std::string errors;
  group.Run([&](int r) {
    std::unique_ptr<Context> ctx;
    Status s = Context::Create(std::make_unique<InProcessRank>(group, r), &ctx);
    if (!s.ok()) throw std::runtime_error("context: " + s.message());
    ctx->end_process_on_peer_failure = false;
    Engine engine(std::move(ctx));
    for (int call = 0; call < kCalls; ++call) {
      std::vector<std::vector<float>> in(2), result(2);
      std::atomic<int> left{2};
      Status status[2];
      std::vector<Work> works;
      for (int j = 0; j < 2; ++j) {
        const int64_t n = length(call, j);
        in[j].resize(n);
        for (int64_t i = 0; i < n; ++i) in[j][i] = Value(r, 2 * call + j, i);
        result[j].assign(n, -1.0f);
        Work w;
        w.name = (j ? "u" : "t") + std::to_string(call);
        w.collective = Collective::kAllreduce;
        w.dtype = w.wire = DataType::kFloat32;
        w.op = ReduceOp::kSum;
        w.shape = {n};
        w.input = in[j].data();
        w.output = result[j].data();
        w.done = [&, j](const Status& st) {
          status[j] = st;
          --left;
        };
        works.push_back(std::move(w));
      }
      engine.EnqueueAndDrive(std::move(works));
      while (left > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
      for (int j = 0; j < 2; ++j) {
        if (!status[j].ok()) {
          std::lock_guard<std::mutex> lock(errors_mutex);
          errors += status[j].message() + R(r) + "\n";
        }
        out[r].push_back(std::move(result[j]));
      }
    }
    in_force[r] = engine.settings();
    engine.Shutdown();
  });
  Expect(errors.empty(), what + ": every call succeeded:\n" + errors);
  int equal = 0, exact = 0;
  for (int k = 0; k < 2 * kCalls; ++k) {
    const int call = k / 2;
    const int64_t n = length(call, k % 2);
    bool same = true, right = true;
    for (int r = 1; r < ranks; ++r) {
      same = same && out[r].size() == out[0].size() &&
             std::memcmp(out[r][k].data(), out[0][k].data(), n * sizeof(float)) == 0;
    }
    // The rank-order sum, with the node's ranks first when hierarchical
    // (local ranks in order, then nodes in order).
    const int local = std::atoi(local_size);
    for (int64_t i = 0; i < n && right; ++i) {
      float total = 0;
      for (int node = 0; node < ranks / local; ++node) {
        float part = Value(node * local, k, i);
        for (int l = 1; l < local; ++l) part += Value(node * local + l, k, i);
        total = node == 0 ? part : total + part;
      }
      right = std::memcmp(&total, &out[0][k][i], sizeof total) == 0;
    }
    equal += same;
    exact += right;
    const std::string which = what + ": call " + std::to_string(call) + (k % 2 ? " B" : " A");
    Expect(same, which + " bitwise equal on every rank");
    Expect(right, which + " is the rank-order sum");
  }
  for (int r = 0; r < ranks; ++r) {
    Expect(in_force[r] == AutotuneSetting{4, 1},
           what + ": the chosen threshold and cycle time are in force" + R(r) + ": " +
               Autotuner::SettingName(in_force[r]));
  }
  const std::string saved = ReadAll(file);
  Expect(Contains(saved, "class 0 chosen 1 ") && Contains(saved, "class 1 chosen 1 "),
         what + ": the classes chose candidate 1:\n" + saved);
  Expect(Contains(saved, "\nsettings 0.25MB/1ms 4MB/1ms 16MB/1ms 64MB/1ms 0.25MB/0.5ms "
                         "0.25MB/2ms 0.25MB/5ms\nsettings_chosen 1 "),
         what + ": the settings chose candidate 1:\n" + saved);
  std::printf("%s: %d of %d tensors bitwise equal, %d exact\n%s", what.c_str(), equal,
              2 * kCalls, exact, saved.c_str());
  SetAutotuneTimeHook(nullptr);
  SetAutotuneWindowHook(nullptr);
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

// A candidate with max_class = 0 (as the one-round exchanges, which get
// 1) is tried only in class 0: the large class takes only the other
// candidate's batches, finishes after kSteps of them, chooses it, and the
// table says the first was not tried there.
void CappedCandidateSkipsLargeClasses() {
  const int ranks = 2;
  InProcessGroup group(ranks, 1 << 20);
  std::vector<std::vector<int>> candidate_of_large(ranks);
  std::vector<std::vector<int>> chosen(ranks);
  // char, not bool: each rank's thread writes its own element, and
  // vector<bool> packs them into shared words (a data race, TSan).
  std::vector<char> decided(ranks, false);
  std::vector<std::string> printed(ranks);
  group.Run([&](int r) {
    std::vector<AutotuneCandidate> candidates = TwoCandidates();
    candidates[0].max_class = 0;
    InProcessRank plane(group, r);
    Autotuner tuner(plane, candidates, kSteps, "world", "capped", "",
                    [&printed, r](const std::string& text) { printed[r] += text; });
    // kSteps x 2 small batches and kSteps large ones measure both classes.
    for (int b = 0; b < 3 * kSteps; ++b) {
      Autotuner::Ticket t;
      const bool large = b % 3 == 2;
      tuner.Before(large ? kLarge : kSmall, &t);
      if (large) candidate_of_large[r].push_back(t.candidate);
      tuner.After(t, 1e-3);
    }
    decided[r] = tuner.decided();
    chosen[r] = tuner.table().chosen;
  });
  for (int r = 0; r < ranks; ++r) {
    for (int k : candidate_of_large[r]) {
      Expect(k == 1, "capped: a large batch took candidate " + std::to_string(k) + R(r));
    }
    Expect(decided[r], "capped: decided after kSteps batches of the one candidate left" + R(r));
    Expect(chosen[r].size() > 2 && chosen[r][2] == 1,
           "capped: the large class chose the candidate tried there" + R(r));
  }
  Expect(Contains(printed[0], "(not tried at this size)"),
         "capped: the table says where a candidate was not tried:\n" + printed[0]);
}

// An exception of keras_ddl's own in the data path (here: the autotuner's
// time hook throws, as a table that does not parse would) is an internal
// error on every rank, not a lost peer: before, it went to the peer
// failure path and read "lost contact in a data transfer" (exit 70).
void InternalErrorIsNotALostPeer() {
  Env a("DDL_AUTOTUNE", "1"), b("DDL_AUTOTUNE_STEPS", "2"), c("DDL_LOCAL_SIZE", "1");
  SetAutotuneTimeHook([](int, int, int, int, double) -> double {
    throw std::runtime_error("injected autotune failure");
  });
  constexpr int ranks = 2;
  InProcessGroup group(ranks, 1 << 16);
  std::vector<Status> got(ranks);
  group.Run([&](int r) {
    std::unique_ptr<Context> ctx;
    Status s = Context::Create(std::make_unique<InProcessRank>(group, r), &ctx);
    if (!s.ok()) throw std::runtime_error("context: " + s.message());
    ctx->end_process_on_peer_failure = false;
    Engine engine(std::move(ctx));
    std::vector<float> in(1000, 1.0f), out(1000);
    std::atomic<bool> done{false};
    Work w;
    w.name = "x";
    w.collective = Collective::kAllreduce;
    w.dtype = w.wire = DataType::kFloat32;
    w.shape = {1000};
    w.input = in.data();
    w.output = out.data();
    w.done = [&](const Status& st) {
      got[r] = st;
      done = true;
    };
    std::vector<Work> works;
    works.push_back(std::move(w));
    engine.EnqueueAndDrive(std::move(works));
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  for (int r = 0; r < ranks; ++r) {
    const std::string& m = got[r].message();
    Expect(got[r].code() == Status::Code::kInternal &&
               Contains(m, "internal error in a data transfer: injected autotune failure") &&
               Contains(m, "a bug in keras_ddl") && !Contains(m, "lost contact"),
           "an autotuner error in the data path is an internal error" + R(r) + ": " + m);
  }
  SetAutotuneTimeHook(nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  setenv("DDL_ALLREDUCE", "auto", 1);
  setenv("DDL_SHM_POOL_MB", "0", 1);
  setenv("DDL_PEER_TIMEOUT_S", "10", 1);
  const std::string only = argc > 1 ? argv[1] : "";
  const std::vector<std::pair<std::string, void (*)()>> checks = {
      {"decide", DecisionFromTheSlowestRank},
      {"file", SavedTableIsReused},
      {"decide", CappedCandidateSkipsLargeClasses},
      {"settings", SettingsFromTheSlowestRank},
      {"settings", SavedSettingsAreReused},
      {"engine", [] { EnginesThroughTheSwitch(3, "1", "flat, 3 ranks"); }},
      {"engine", [] { EnginesThroughTheSwitch(4, "2", "2 nodes x 2 local ranks"); }},
      {"internal", InternalErrorIsNotALostPeer},
  };
  for (const auto& [name, check] : checks) {
    if (!only.empty() && only != name) continue;
    try {
      check();
    } catch (const std::exception& e) {
      Expect(false, name + ": " + e.what());
    }
    std::fflush(stdout);
  }
  return ddl_test::Summary();
}
