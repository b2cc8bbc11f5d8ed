#include "autotune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

namespace ddl {

namespace {

AutotuneTimeHook& Hook() {
  static AutotuneTimeHook hook;
  return hook;
}

// v2 added the fusion threshold and cycle time. A v1 table is refused:
// loading its algorithms alone would leave the settings to a measurement
// whose result the next save would mix with a table it did not make.
constexpr const char* kHeader = "keras_ddl autotune table v2";
constexpr const char* kHeaderV1 = "keras_ddl autotune table v1";

// Doubles as bytes and back (the gather's payload; one machine's ranks
// and a cluster's share the representation, IEEE doubles).
void PutDouble(std::vector<char>* out, double v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out->insert(out->end(), p, p + sizeof v);
}
double GetDouble(const std::vector<char>& in, size_t* at) {
  double v = std::numeric_limits<double>::quiet_NaN();
  if (*at + sizeof v <= in.size()) std::memcpy(&v, in.data() + *at, sizeof v);
  *at += sizeof v;
  return v;
}

}  // namespace

double AutotuneMedian(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

namespace {

// A measure of a saved table: "nan" (not measured) or a finite number
// >= 0, the whole word (strtod's end at its end), appended to `out`.
bool ReadMeasure(const std::string& word, std::vector<double>* out) {
  if (word == "nan") {
    out->push_back(std::nan(""));
    return true;
  }
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  if (end != word.c_str() + word.size() || !std::isfinite(v) || v < 0) return false;
  out->push_back(v);
  return true;
}

std::string Format(const char* fmt, double v) {
  char text[64];
  std::snprintf(text, sizeof text, fmt, v);
  return text;
}

}  // namespace

void SetAutotuneTimeHook(AutotuneTimeHook hook) { Hook() = std::move(hook); }

int Autotuner::SizeClass(size_t bytes) {
  const size_t bounds[kClasses - 1] = {64 << 10, 1 << 20, 8 << 20, 64 << 20};
  int c = 0;
  while (c < kClasses - 1 && bytes >= bounds[c]) ++c;
  return c;
}

const char* Autotuner::ClassName(int size_class) {
  static const char* names[kClasses] = {"< 64 KiB", "64 KiB - 1 MiB", "1 - 8 MiB", "8 - 64 MiB",
                                        ">= 64 MiB"};
  return names[size_class];
}

Autotuner::Autotuner(ControlPlane& plane, std::vector<AutotuneCandidate> candidates, int steps,
                     std::string step, std::string shape, std::string file,
                     std::function<void(const std::string&)> print)
    : plane_(plane), candidates_(std::move(candidates)), steps_(std::max(1, steps)),
      step_(std::move(step)), shape_(std::move(shape)), file_(std::move(file)),
      print_(std::move(print)), seen_(kClasses, false), batches_(kClasses, 0),
      samples_(kClasses, std::vector<std::vector<double>>(candidates_.size())) {
  if (!print_) print_ = [](const std::string& text) { std::fputs(text.c_str(), stderr); };
  table_.median.assign(kClasses, std::vector<double>(candidates_.size(),
                                                     std::numeric_limits<double>::quiet_NaN()));
  table_.chosen.assign(kClasses, -1);
}

NetworkChoice Autotuner::Before(size_t bytes, Ticket* ticket) {
  if (!started_) Start();
  *ticket = Ticket{};
  if (bytes == 0) return NetworkChoice::kAuto;  // nothing crosses the network
  const int c = SizeClass(bytes);
  ticket->size_class = c;
  if (decided_) {
    return table_.chosen[c] >= 0 ? candidates_[table_.chosen[c]].choice : NetworkChoice::kAuto;
  }
  seen_[c] = true;
  std::vector<int> tried;
  for (int k = 0; k < static_cast<int>(candidates_.size()); ++k) {
    if (Tried(k, c)) tried.push_back(k);
  }
  const int n = static_cast<int>(tried.size());
  const int k = batches_[c];
  if (k >= steps_ * n) return NetworkChoice::kAuto;  // this class is measured
  ++batches_[c];
  // Candidates take turns, so a slow start (first-touch allocations) or a
  // drift in the machine's load falls on all of them alike.
  ticket->candidate = tried[k % n];
  ticket->sample = k / n;
  return candidates_[ticket->candidate].choice;
}

bool Autotuner::Tried(int k, int c) const {
  const int max_class = candidates_[k].max_class;
  return max_class < 0 || c <= max_class;
}

void Autotuner::After(const Ticket& ticket, double seconds) {
  if (decided_ || ticket.size_class < 0) return;
  if (ticket.candidate >= 0) {
    const AutotuneTimeHook& hook = Hook();
    const double t = hook ? hook(plane_.rank(), ticket.size_class, ticket.candidate,
                                 ticket.sample, seconds)
                          : seconds;
    samples_[ticket.size_class][ticket.candidate].push_back(t);
  }
  for (int c = 0; c < kClasses; ++c) {
    int tried = 0;
    for (int k = 0; k < static_cast<int>(candidates_.size()); ++k) tried += Tried(k, c);
    if (seen_[c] && batches_[c] < steps_ * tried) return;
  }
  // Every rank completes its last class at the same batch.
  Finish();
}

void Autotuner::Start() {
  started_ = true;
  // Rank 0's settings to try (its cycle time may differ from another
  // rank's) and its saved table, if it has one of this shape, are every
  // rank's.
  std::vector<char> payload;
  if (plane_.rank() == 0 && !file_.empty()) {
    std::ifstream in(file_, std::ios::binary | std::ios::ate);
    if (in) {
      std::stringstream text;
      AutotuneTable loaded;
      std::string why;
      const std::streamoff size = in.tellg();
      in.seekg(0);
      if (size < 0 || static_cast<uint64_t>(size) > kMaxTableBytes) {
        why = "it is not a file of at most " + std::to_string(kMaxTableBytes) + " bytes";
      } else if (!(text << in.rdbuf()) && size > 0) {
        why = "it cannot be read";
      } else if (Parse(text.str(), &loaded, &why) && !settings_.empty() &&
                 loaded.setting_chosen < 0) {
        why = "it has no chosen fusion threshold and cycle time";
      } else if (why.empty()) {
        const std::string s = text.str();
        payload.assign(s.begin(), s.end());
      }
      if (!why.empty()) {
        print_("keras_ddl: warning: not using DDL_AUTOTUNE_FILE=" + file_ + ": " + why +
               "; measuring again\n");
      }
    }
  }
  if (plane_.rank() == 0) {
    const std::string line = SettingsLine() + "\n";
    payload.insert(payload.begin(), line.begin(), line.end());
  }
  plane_.BroadcastBytes(payload, 0);
  const std::string text(payload.begin(), payload.end());
  const size_t eol = text.find('\n');
  // Every rank, rank 0 too, runs the parsed values: the same doubles.
  if (eol == std::string::npos || !ParseSettings(text.substr(0, eol), &settings_)) {
    throw std::runtime_error("autotune: rank 0's settings do not parse: " + text.substr(0, eol));
  }
  window_seconds_.assign(settings_.size(), {});
  window_total_bytes_.assign(settings_.size(), {});
  table_.setting_score.assign(settings_.size(), std::numeric_limits<double>::quiet_NaN());
  if (eol + 1 == text.size()) return;
  std::string why;
  if (!Parse(text.substr(eol + 1), &table_, &why, false)) {
    // Rank 0 parsed the same text with the same shape: cannot differ.
    throw std::runtime_error("autotune: rank 0's saved table does not parse here: " + why);
  }
  decided_ = true;
  settings_decided_ = true;
  if (plane_.rank() == 0) print_(Describe("loaded from " + file_ + ", not measured again"));
}

std::vector<std::vector<std::vector<double>>> Autotuner::GatherLists(
    const std::vector<std::vector<double>>& mine) const {
  // Per list a count, then its values.
  std::vector<char> bytes;
  for (const std::vector<double>& values : mine) {
    PutDouble(&bytes, static_cast<double>(values.size()));
    for (double v : values) PutDouble(&bytes, v);
  }
  std::vector<std::vector<std::vector<double>>> lists;
  for (const std::vector<char>& from : plane_.GatherBytes(bytes, 0)) {
    size_t at = 0;
    std::vector<std::vector<double>> rank_lists(mine.size());
    for (std::vector<double>& values : rank_lists) {
      // A payload cut short reads NaN: no more values.
      const double count = GetDouble(from, &at);
      if (!(count > 0)) continue;
      for (int i = 0; i < static_cast<int>(count); ++i) values.push_back(GetDouble(from, &at));
    }
    lists.push_back(std::move(rank_lists));
  }
  return lists;
}

void Autotuner::ShareTable(const std::string& what) {
  std::vector<char> decision;
  if (plane_.rank() == 0) {
    const std::string text = Serialize();
    decision.assign(text.begin(), text.end());
  }
  plane_.BroadcastBytes(decision, 0);
  std::string why;
  if (!Parse(std::string(decision.begin(), decision.end()), &table_, &why, false)) {
    throw std::runtime_error("autotune: rank 0's " + what + " does not parse: " + why);
  }
}

void Autotuner::Finish() {
  // This rank's times, as lists per class and candidate.
  const int n = static_cast<int>(candidates_.size());
  std::vector<std::vector<double>> mine;
  for (const auto& per_class : samples_) {
    for (const auto& values : per_class) mine.push_back(values);
  }
  const auto all = GatherLists(mine);
  if (plane_.rank() == 0) {
    std::vector<Samples> per_rank;
    for (const auto& lists : all) {
      Samples s(kClasses, std::vector<std::vector<double>>(n));
      for (int c = 0; c < kClasses; ++c) {
        for (int k = 0; k < n; ++k) s[c][k] = lists[c * n + k];
      }
      per_rank.push_back(std::move(s));
    }
    table_ = Decide(per_rank, n);
  }
  ShareTable("decision");
  decided_ = true;
  const std::string how =
      "measured " + std::to_string(steps_) + " batches per candidate and size class";
  if (settings_.empty()) {
    Report(Describe(how));
    return;
  }
  // The algorithms are shown as soon as they are chosen: the settings'
  // phase that follows takes steps x settings x cycles more cycles, which
  // a short job may not reach (the destructor then says so).
  if (plane_.rank() == 0) {
    const long total = static_cast<long>(steps_) * static_cast<long>(settings_.size()) * cycles_;
    print_(DescribeAlgorithms(how) + "  next: " + std::to_string(settings_.size()) +
           " fusion thresholds and cycle times, " + std::to_string(steps_) + " windows of " +
           std::to_string(cycles_) + (cycles_ == 1 ? " cycle" : " cycles") +
           " each: the next " + std::to_string(total) + " cycles that run allreduces\n");
  }
}

void Autotuner::Report(const std::string& text) {
  if (plane_.rank() != 0) return;
  print_(text);
  Save();
}

AutotuneTable Autotuner::Decide(const std::vector<Samples>& per_rank, int candidates) {
  AutotuneTable t;
  t.median.assign(kClasses,
                  std::vector<double>(candidates, std::numeric_limits<double>::quiet_NaN()));
  t.chosen.assign(kClasses, -1);
  for (int c = 0; c < kClasses; ++c) {
    for (int k = 0; k < candidates; ++k) {
      // Samples every rank has (all of them, unless a rank's list is short).
      size_t samples = std::numeric_limits<size_t>::max();
      for (const Samples& s : per_rank) samples = std::min(samples, s[c][k].size());
      if (per_rank.empty() || samples == 0) continue;
      std::vector<double> slowest(samples, -std::numeric_limits<double>::infinity());
      for (const Samples& s : per_rank) {
        for (size_t i = 0; i < samples; ++i) slowest[i] = std::max(slowest[i], s[c][k][i]);
      }
      t.median[c][k] = AutotuneMedian(slowest);
      if (t.chosen[c] < 0 || t.median[c][k] < t.median[c][t.chosen[c]]) t.chosen[c] = k;
    }
  }
  return t;
}

namespace {

std::string Pad(std::string s, size_t width) {
  s.resize(std::max(width, s.size()), ' ');
  return s;
}

// A table row without its trailing blanks, and a newline.
std::string Row(const std::string& row) { return row.substr(0, row.find_last_not_of(' ') + 1) + "\n"; }

}  // namespace

std::string Autotuner::Describe(const std::string& how) const {
  if (settings_.empty()) return DescribeAlgorithms(how);
  return DescribeAlgorithms(how) + SettingsRows();
}

std::string Autotuner::DescribeAlgorithms(const std::string& how) const {
  std::ostringstream out;
  out << "keras_ddl autotune: the " << step_ << " step's allreduce (" << shape_ << "), " << how
      << "; time = median over batches of the slowest rank's time\n";
  size_t width = 9;
  for (const AutotuneCandidate& k : candidates_) width = std::max(width, k.name.size());
  auto pad = Pad;
  out << "  " << pad("size class", 16) << pad("candidate", width + 2) << "slowest-rank median"
      << "  chosen\n";
  for (int c = 0; c < kClasses; ++c) {
    bool any = false;
    for (double m : table_.median[c]) any = any || !std::isnan(m);
    if (!any) {
      out << "  " << pad(ClassName(c), 16) << "(no batch of this size while tuning: size rule)\n";
      continue;
    }
    for (size_t k = 0; k < candidates_.size(); ++k) {
      const double m = table_.median[c][k];
      std::string row = "  " + pad(k == 0 ? ClassName(c) : "", 16) +
                        pad(candidates_[k].name, width + 2) +
                        pad(!Tried(static_cast<int>(k), c) ? "(not tried at this size)"
                            : std::isnan(m)                   ? "-"
                                                              : Format("%10.3f ms", m * 1e3),
                            21) +
                        (table_.chosen[c] == static_cast<int>(k) ? "  *" : "");
      out << row.substr(0, row.find_last_not_of(' ') + 1) << "\n";
    }
  }
  return out.str();
}

std::string Autotuner::DescribeSettings(const std::string& how) const {
  return "keras_ddl autotune: the " + step_ + " step's fusion threshold and cycle time (" +
         shape_ + "), " + how + "\n" + SettingsRows();
}

std::string Autotuner::SettingsRows() const {
  // The score's definition is in the heading: wall time, so a window's
  // compute counts (see BeginCycle).
  std::string out = "  " + Pad("fusion threshold", 18) + Pad("cycle time", 12) +
                    Pad("slowest-rank median", 32) + "  chosen" +
                    "   (MiB allreduced per second of wall time, per window of cycles)\n";
  for (size_t k = 0; k < settings_.size(); ++k) {
    const double score = k < table_.setting_score.size() ? table_.setting_score[k] : std::nan("");
    out += Row("  " + Pad(Format("%g MB", settings_[k].fusion_threshold_mb), 18) +
               Pad(Format("%g ms", settings_[k].cycle_time_ms), 12) +
               Pad(std::isnan(score) ? "-" : Format("%12.3f MiB/s", score / (1 << 20)), 20) +
               Pad(k == 0 ? "(configured)" : "", 12) +
               (table_.setting_chosen == static_cast<int>(k) ? "  *" : ""));
  }
  return out;
}

std::string Autotuner::Serialize(const AutotuneTable& table) const {
  std::ostringstream out;
  out << kHeader << "\n";
  out << "shape " << shape_ << "\n";
  out << "candidates";
  for (const AutotuneCandidate& k : candidates_) out << " " << k.name;
  out << "\n";
  for (int c = 0; c < kClasses; ++c) {
    out << "class " << c << " chosen " << table.chosen[c] << " median_seconds";
    for (double m : table.median[c]) out << " " << (std::isnan(m) ? "nan" : Format("%.9g", m));
    out << "\n";
  }
  out << SettingsLine() << "\n";
  out << "settings_chosen " << table.setting_chosen << " median_bytes_per_second";
  for (size_t k = 0; k < settings_.size(); ++k) {
    const double v = k < table.setting_score.size() ? table.setting_score[k] : std::nan("");
    out << " " << (std::isnan(v) ? "nan" : Format("%.9g", v));
  }
  out << "\n";
  return out.str();
}

bool Autotuner::Parse(const std::string& text, AutotuneTable* out, std::string* why,
                      bool check_shape) const {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) {
    *why = line == kHeaderV1 ? "it is a table of an earlier keras_ddl (v1), without the fusion "
                               "threshold and cycle time"
                             : "not a keras_ddl autotune table";
    return false;
  }
  if (!std::getline(in, line) || line.rfind("shape ", 0) != 0 ||
      (check_shape && line != "shape " + shape_)) {
    *why = "it was measured for another job shape (" +
           (line.rfind("shape ", 0) == 0 ? line.substr(6) : std::string("unknown")) +
           "; this job: " + shape_ + ")";
    return false;
  }
  std::string names = "candidates";
  for (const AutotuneCandidate& k : candidates_) names += " " + k.name;
  if (!std::getline(in, line) || line != names) {
    *why = "it has other candidates (" + line + "; this job: " + names + ")";
    return false;
  }
  AutotuneTable t;
  const int n = static_cast<int>(candidates_.size());
  for (int c = 0; c < kClasses; ++c) {
    std::string word1, word2, word3;
    int index = -1, chosen = -2;
    if (!std::getline(in, line)) {
      *why = "it ends early";
      return false;
    }
    std::istringstream row(line);
    row >> word1 >> index >> word2 >> chosen >> word3;
    std::vector<double> medians;
    bool numbers = true;
    for (std::string v; numbers && row >> v;) numbers = ReadMeasure(v, &medians);
    if (!numbers || word1 != "class" || index != c || word2 != "chosen" || chosen < -1 ||
        chosen >= n || word3 != "median_seconds" || static_cast<int>(medians.size()) != n) {
      *why = "malformed line '" + line + "'";
      return false;
    }
    // A choice this keras_ddl would no longer make (a candidate since
    // capped below this size, as the one-round exchanges are below 1 MiB):
    // the table is refused and the job measures again, rather than run a
    // setup known to pass the peer timeout on slow links.
    if (chosen >= 0 && !Tried(chosen, c)) {
      *why = "it chose " + candidates_[chosen].name + " for batches of " + ClassName(c) +
             ", which this keras_ddl no longer tries at that size";
      return false;
    }
    t.chosen.push_back(chosen);
    t.median.push_back(medians);
  }
  const std::string settings = SettingsLine();
  if (!std::getline(in, line) || line != settings) {
    *why = "it has other fusion thresholds and cycle times (" + line + "; this job: " +
           settings + ")";
    return false;
  }
  std::string word1, word2;
  int chosen = -2;
  if (!std::getline(in, line)) {
    *why = "it ends early";
    return false;
  }
  std::istringstream row(line);
  row >> word1 >> chosen >> word2;
  bool numbers = true;
  for (std::string v; numbers && row >> v;) numbers = ReadMeasure(v, &t.setting_score);
  if (!numbers || word1 != "settings_chosen" || chosen < -1 ||
      chosen >= static_cast<int>(settings_.size()) || word2 != "median_bytes_per_second" ||
      t.setting_score.size() != settings_.size()) {
    *why = "malformed line '" + line + "'";
    return false;
  }
  // The last line: anything after it (a second table appended, a
  // half-written copy) means the file is not one table.
  if (in.peek() != std::char_traits<char>::eof()) {
    *why = "it has bytes after its last line";
    return false;
  }
  t.setting_chosen = chosen;
  *out = std::move(t);
  return true;
}

void Autotuner::Save() const {
  if (file_.empty()) return;
  // Written beside the file and renamed over it: a reader (another job
  // starting) sees the old table or the new one, never half of one.
  const std::string tmp = file_ + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << Serialize();
    out.close();
    if (!out) {
      print_("keras_ddl: warning: could not write DDL_AUTOTUNE_FILE=" + file_ + "\n");
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), file_.c_str()) != 0) {
    print_("keras_ddl: warning: could not write DDL_AUTOTUNE_FILE=" + file_ + "\n");
    std::remove(tmp.c_str());
  }
}

}  // namespace ddl
