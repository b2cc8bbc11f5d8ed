// The second phase of DDL_AUTOTUNE (autotune.h): the fusion threshold and
// the cycle time, scored on whole windows of the job's own cycles.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "autotune.h"

namespace ddl {

namespace {

AutotuneWindowHook& WindowHook() {
  static AutotuneWindowHook hook;
  return hook;
}

}  // namespace

void SetAutotuneWindowHook(AutotuneWindowHook hook) { WindowHook() = std::move(hook); }

std::string Autotuner::SettingName(const AutotuneSetting& s) {
  char text[64];
  std::snprintf(text, sizeof text, "%.6gMB/%.6gms", s.fusion_threshold_mb, s.cycle_time_ms);
  return text;
}

bool Autotuner::ParseSettings(const std::string& line, std::vector<AutotuneSetting>* out) {
  std::istringstream in(line);
  std::string word;
  if (!(in >> word) || word != "settings") return false;
  std::vector<AutotuneSetting> parsed;
  while (in >> word) {
    AutotuneSetting s;
    char tail[8] = {0};
    if (std::sscanf(word.c_str(), "%lfMB/%lf%7s", &s.fusion_threshold_mb, &s.cycle_time_ms,
                    tail) != 3 ||
        std::strcmp(tail, "ms") != 0) {
      return false;
    }
    parsed.push_back(s);
  }
  *out = std::move(parsed);
  return true;
}

std::string Autotuner::SettingsLine() const {
  std::string line = "settings";
  for (const AutotuneSetting& s : settings_) line += " " + SettingName(s);
  return line;
}

void Autotuner::TuneSettings(std::vector<AutotuneSetting> settings, int cycles) {
  if (started_) throw std::logic_error("autotune: TuneSettings after the first batch");
  settings_ = std::move(settings);
  cycles_ = std::max(1, cycles);
}

AutotuneSetting Autotuner::BeginCycle(size_t bytes) {
  if (settings_.empty()) throw std::logic_error("autotune: BeginCycle without TuneSettings");
  if (!started_) Start();
  auto chosen = [this] { return settings_[std::max(0, table_.setting_chosen)]; };
  if (settings_decided_) return chosen();
  // The algorithms are measured with the configured setting, so their
  // times compare batches fused alike.
  if (!decided_) return settings_[0];
  const auto now = std::chrono::steady_clock::now();
  const long n = static_cast<long>(settings_.size());
  const long i = settings_cycle_++;
  if (i > 0 && i % cycles_ == 0) {
    // This cycle's start closes the window before it: its time includes
    // the waits between its cycles and whatever the program did there
    // (the step's compute), which is where a cycle time or a threshold
    // shows (overlap, rounds per step).
    const long w = i / cycles_ - 1;
    const int k = static_cast<int>(w % n);
    double seconds = std::chrono::duration<double>(now - window_start_).count();
    const AutotuneWindowHook& hook = WindowHook();
    if (hook) seconds = hook(plane_.rank(), k, static_cast<int>(w / n), seconds);
    window_seconds_[k].push_back(seconds);
    window_total_bytes_[k].push_back(window_bytes_);
  }
  if (i == static_cast<long>(steps_) * n * cycles_) {
    // Every rank reaches this cycle, so the switch happens here on all.
    FinishSettings();
    return chosen();
  }
  if (i % cycles_ == 0) {
    window_start_ = now;
    window_bytes_ = 0;
  }
  window_bytes_ += static_cast<double>(bytes);
  return settings_[(i / cycles_) % n];
}

void Autotuner::FinishSettings() {
  const auto seconds = GatherLists(window_seconds_);
  // The bytes of a window are the same on every rank (the same cycles).
  if (plane_.rank() == 0) DecideSettings(seconds, window_total_bytes_, &table_);
  ShareTable("settings decision");
  settings_decided_ = true;
  // The algorithms' table was printed when they were chosen (Finish).
  Report(DescribeSettings("measured " + std::to_string(steps_) + " windows of " +
                          std::to_string(cycles_) + (cycles_ == 1 ? " cycle" : " cycles") +
                          " per setting, after the algorithms"));
}

void Autotuner::DecideSettings(const std::vector<std::vector<std::vector<double>>>& seconds,
                               const std::vector<std::vector<double>>& bytes,
                               AutotuneTable* table) {
  const size_t n = bytes.size();
  table->setting_score.assign(n, std::numeric_limits<double>::quiet_NaN());
  table->setting_chosen = -1;
  for (size_t k = 0; k < n; ++k) {
    // Windows every rank has (all of them, unless a rank's list is short).
    size_t windows = seconds.empty() ? 0 : bytes[k].size();
    for (const auto& rank : seconds) windows = std::min(windows, rank[k].size());
    std::vector<double> scores;
    for (size_t w = 0; w < windows; ++w) {
      // The job moves at its slowest rank's pace.
      double slowest = 0;
      for (const auto& rank : seconds) slowest = std::max(slowest, rank[k][w]);
      if (slowest > 0) scores.push_back(bytes[k][w] / slowest);
    }
    const double score = AutotuneMedian(scores);
    table->setting_score[k] = score;
    if (!std::isnan(score) &&
        (table->setting_chosen < 0 || score > table->setting_score[table->setting_chosen])) {
      table->setting_chosen = static_cast<int>(k);
    }
  }
}

Autotuner::~Autotuner() {
  // Say so rather than leave the reader of stderr waiting for a table.
  if (started_ && plane_.rank() == 0 && !(decided_ && settings_decided())) {
    const long needed = static_cast<long>(steps_) * static_cast<long>(settings_.size()) * cycles_;
    print_("keras_ddl autotune: the job ended before tuning finished (" +
           std::string(decided_ ? "the algorithms were chosen, as printed above; " +
                                      std::to_string(settings_cycle_) + " of the " +
                                      std::to_string(needed) +
                                      " cycles of the fusion threshold and cycle time had run"
                                : "while measuring the algorithms") +
           "); nothing saved. A longer job, or fewer DDL_AUTOTUNE_STEPS or "
           "DDL_AUTOTUNE_CYCLES, lets it finish\n");
  }
}

}  // namespace ddl
