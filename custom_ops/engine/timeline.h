// Chrome-trace / Perfetto timeline written by rank 0 (DDL_TIMELINE): one row
// per tensor with its negotiation, execution and algorithm phases, plus
// markers from Python. The file is a JSON array that is closed after every
// event, so it stays loadable even if the job is killed.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "../common/types.h"

namespace ddl {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Returns null with *status set when the file cannot be written.
  static std::unique_ptr<Timeline> Open(const std::string& path, Status* status);
  ~Timeline();

  // A span on `row` (a tensor name, or a fixed row such as "markers").
  // `args_json` is a JSON object body without braces, e.g. "\"bytes\": 4".
  void Span(const std::string& row, const std::string& phase, Clock::time_point start,
            Clock::time_point end, const std::string& args_json = "");
  void Marker(const std::string& label);

 private:
  explicit Timeline(FILE* file) : file_(file), origin_(Clock::now()) {}
  int RowId(const std::string& row);  // writes the row's name on first use
  void Write(const std::string& event);
  int64_t Micros(Clock::time_point t) const;

  std::mutex mutex_;
  FILE* file_;
  Clock::time_point origin_;
  bool first_event_ = true;
  std::unordered_map<std::string, int> rows_;
};

// JSON string literal of `text`, quotes included.
std::string JsonString(const std::string& text);

}  // namespace ddl
