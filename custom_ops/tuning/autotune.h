// DDL_AUTOTUNE=1: picks the network step's algorithm per size of fused
// batch by timing the candidates on the job's own allreduces during its
// first steps, and shows what it measured (docs/topology.md, "Autotune").
//
// The executor asks Before() for the choice of every allreduce batch and
// reports its time to After(). Batches come from negotiated responses, so
// every rank of the job sees the same batches in the same order, of the
// same byte size: each rank counts them and reaches the same plan without
// talking. For each size class the first DDL_AUTOTUNE_STEPS x candidates
// batches cycle through the candidates (c0 c1 c0 c1 ...); further batches
// of a class that is done run the size rule. After the batch that
// completes the last class seen so far, every rank sends its times to rank
// 0 (GatherBytes); rank 0 takes, per sample, the slowest rank's time (a
// collective is as fast as its slowest rank) and, per candidate, the
// median over samples; it picks the fastest and broadcasts the table
// (BroadcastBytes), so every rank switches at the same batch. A class not
// seen by then keeps the size rule.
//
// Then, with settings to tune (TuneSettings), the fusion threshold and the
// cycle time: from the next executor cycle that runs allreduces, the
// candidate settings take turns by windows of `cycles` such cycles
// (DDL_AUTOTUNE_STEPS windows each). The executor's cycles run the
// negotiated ready lists, the same on every rank, so every rank counts the
// same cycles and uses the same setting in each. A window's score is the
// bytes it allreduced over the wall time from its first cycle's start to
// the next window's first cycle's start; rank 0 takes per window the
// slowest rank's time, per candidate the median, picks the highest score
// and broadcasts it at the cycle that closes the last window, which
// already runs the choice. Rank 0 prints the one table to stderr and, with
// DDL_AUTOTUNE_FILE, saves it; a later run of the same shape loads both
// parts at its first batch instead of measuring.
//
// Plain C++: no MPI, TensorFlow or engine types, so tests/core drives it
// over threads as ranks.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "../algorithms/allreduce.h"
#include "../transport/control_plane.h"

namespace ddl {

struct AutotuneCandidate {
  std::string name;  // as printed and saved
  NetworkChoice choice;
  // The largest size class (Autotuner::SizeClass) it is tried in; -1:
  // every class. A one-round exchange sends whole buffers to every peer:
  // a 64 MB batch of it over a slow uplink is tens of seconds per message,
  // past the peer timeout, and never the choice.
  int max_class = -1;
};

// Replaces each measured time by hook(rank, size class, candidate, sample,
// measured) while set (tests: a deterministic decision); null: the times
// as measured. Set it before the engines start.
using AutotuneTimeHook = std::function<double(int, int, int, int, double)>;
void SetAutotuneTimeHook(AutotuneTimeHook hook);
// The same for the settings' windows: hook(rank, candidate, sample,
// measured seconds) is the window's seconds.
using AutotuneWindowHook = std::function<double(int, int, int, double)>;
void SetAutotuneWindowHook(AutotuneWindowHook hook);

// What the executor runs a cycle with: the largest fused batch and the
// time between negotiation rounds.
struct AutotuneSetting {
  double fusion_threshold_mb = 0;
  double cycle_time_ms = 0;
  bool operator==(const AutotuneSetting& o) const {
    return fusion_threshold_mb == o.fusion_threshold_mb && cycle_time_ms == o.cycle_time_ms;
  }
};

// What was measured and chosen: per size class, the median of the slowest
// rank's times per candidate (NaN: not measured) and the chosen
// candidate's index (-1: none, the size rule).
struct AutotuneTable {
  std::vector<std::vector<double>> median;  // [class][candidate], seconds
  std::vector<int> chosen;                  // [class]
  // Per setting, the median over windows of bytes / the slowest rank's
  // seconds (NaN: not measured), and the chosen setting (-1: none yet).
  std::vector<double> setting_score;  // [setting], bytes per second
  int setting_chosen = -1;
};

// The median (the mean of the middle two of an even count); NaN if empty.
double AutotuneMedian(std::vector<double> v);

class Autotuner {
 public:
  static constexpr int kClasses = 5;
  // Class of a fused batch of `bytes`: < 64 KiB, < 1 MiB, < 8 MiB,
  // < 64 MiB, the rest.
  static int SizeClass(size_t bytes);
  static const char* ClassName(int size_class);

  // `step`: which network step is tuned ("world", "cross-node", "racks"),
  // for the table. `shape`: the job's shape (ranks, nodes, racks, step); a
  // saved table is reused only for the same shape and candidates. `file`:
  // DDL_AUTOTUNE_FILE of this rank (only rank 0's is read and written).
  // `print`: where rank 0's table goes (stderr when null).
  Autotuner(ControlPlane& plane, std::vector<AutotuneCandidate> candidates, int steps,
            std::string step, std::string shape, std::string file,
            std::function<void(const std::string&)> print = nullptr);

  // One batch's place in the plan.
  struct Ticket {
    int size_class = -1;
    int candidate = -1;  // -1: not a measured batch
    int sample = -1;
  };
  // The choice for the next allreduce batch, of `bytes` (the same calls,
  // in the same order, on every rank). The first call is collective (it
  // broadcasts rank 0's saved table, if any).
  NetworkChoice Before(size_t bytes, Ticket* ticket);
  // This rank's seconds for the batch `ticket` came with. Collective at
  // the batch that completes the measurements.
  void After(const Ticket& ticket, double seconds);
  // Whether candidate k is tried in size class c (see max_class).
  bool Tried(int k, int c) const;

  // Tunes the fusion threshold and cycle time too, after the algorithms:
  // `settings[0]` is the configured one (and the one used until then),
  // each candidate gets DDL_AUTOTUNE_STEPS windows of `cycles` cycles.
  // Before the first Before or BeginCycle. Rank 0's list is every rank's
  // (the cycle time may differ per rank).
  void TuneSettings(std::vector<AutotuneSetting> settings, int cycles);
  // At the start of every executor cycle that runs allreduces (the same
  // cycles on every rank), with the bytes it allreduces: the setting to
  // run it with. Collective at its first call (as Before) and at the cycle
  // that closes the last window.
  AutotuneSetting BeginCycle(size_t bytes);
  ~Autotuner();

  bool decided() const { return decided_; }
  bool settings_decided() const { return settings_.empty() || settings_decided_; }
  const std::vector<AutotuneSetting>& settings() const { return settings_; }
  const AutotuneTable& table() const { return table_; }
  const std::vector<AutotuneCandidate>& candidates() const { return candidates_; }

  // Rank 0's decision from every rank's times, samples[rank][class]
  // [candidate][sample]: per sample the slowest rank, per candidate the
  // median over samples, per class the fastest candidate (the first of
  // equals).
  using Samples = std::vector<std::vector<std::vector<double>>>;
  static AutotuneTable Decide(const std::vector<Samples>& per_rank, int candidates);
  // Rank 0's decision on the settings: seconds[rank][setting][window] and
  // bytes[setting][window] (the same on every rank) give per window
  // bytes / the slowest rank's seconds, per setting the median over
  // windows; fills table->setting_score and the highest's index (the first
  // of equals, so a tie keeps the configured setting) in setting_chosen.
  static void DecideSettings(const std::vector<std::vector<std::vector<double>>>& seconds,
                             const std::vector<std::vector<double>>& bytes, AutotuneTable* table);
  // A setting as printed and saved ("128MB/1ms"), and a list of them back.
  static std::string SettingName(const AutotuneSetting& s);
  static bool ParseSettings(const std::string& line, std::vector<AutotuneSetting>* out);

  // The table as printed (headed "keras_ddl autotune:"): the algorithms
  // per size class, then, with settings to tune, the settings' rows.
  // While measuring, rank 0 prints the algorithms' part when they are
  // chosen (DescribeAlgorithms) and the settings' part when those are
  // (DescribeSettings); a loaded table is printed whole.
  std::string Describe(const std::string& how) const;
  std::string DescribeAlgorithms(const std::string& how) const;
  std::string DescribeSettings(const std::string& how) const;
  // The saved form and back; Parse fails (with the reason) on another
  // candidate list, a choice of a candidate this build does not try at
  // that size (Tried), a malformed text (a number that is not one, a line
  // cut short, anything after the last line) or, with `check_shape`, another
  // shape. A refused file is measured again (Start warns, naming it). What rank 0 broadcasts is parsed without the shape check: a
  // job whose nodes differ in size shows each rank another local size,
  // and rank 0's shape is the one that counts.
  std::string Serialize() const { return Serialize(table_); }
  std::string Serialize(const AutotuneTable& table) const;
  // The most a saved table may hold (a few hundred bytes per class): a
  // larger file is refused unread.
  static constexpr size_t kMaxTableBytes = 1 << 20;
  bool Parse(const std::string& text, AutotuneTable* out, std::string* why,
             bool check_shape = true) const;

 private:
  void Start();
  void Finish();
  void FinishSettings();
  void Report(const std::string& text);  // rank 0: prints the text, saves the table
  std::string SettingsRows() const;      // the settings' part of the table
  // Every rank's lists of values to rank 0: there, [rank][list][value]
  // (elsewhere empty). The lists are the same in number on every rank.
  std::vector<std::vector<std::vector<double>>> GatherLists(
      const std::vector<std::vector<double>>& mine) const;
  // Rank 0's table_ to every rank: serialized, broadcast and parsed back on
  // every rank (rank 0 too, so all hold the same values); `what` names
  // the decision in the error if it does not parse.
  void ShareTable(const std::string& what);
  void Save() const;
  std::string SettingsLine() const;

  ControlPlane& plane_;
  std::vector<AutotuneCandidate> candidates_;
  int steps_;
  std::string step_, shape_, file_;
  std::function<void(const std::string&)> print_;
  bool started_ = false;
  bool decided_ = false;
  std::vector<bool> seen_;
  std::vector<int> batches_;  // measured batches so far, per class
  Samples samples_;           // this rank's, [class][candidate][sample]
  AutotuneTable table_;
  // The settings' phase: candidates, cycles per window, cycles counted
  // since it began, the open window, this rank's seconds and bytes per
  // [setting][window].
  std::vector<AutotuneSetting> settings_;
  int cycles_ = 1;
  bool settings_decided_ = false;
  long settings_cycle_ = 0;
  std::chrono::steady_clock::time_point window_start_;
  double window_bytes_ = 0;
  std::vector<std::vector<double>> window_seconds_, window_total_bytes_;
};

}  // namespace ddl
