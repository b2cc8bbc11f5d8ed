#include "timeline.h"

#include <cerrno>
#include <cstring>

namespace ddl {

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::unique_ptr<Timeline> Timeline::Open(const std::string& path, Status* status) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    *status = Status::InvalidArgument("DDL_TIMELINE='" + path + "' cannot be written: " +
                                      std::strerror(errno));
    return nullptr;
  }
  std::fputs("[\n]\n", file);
  std::fflush(file);
  return std::unique_ptr<Timeline>(new Timeline(file));
}

Timeline::~Timeline() {
  if (file_ != nullptr) std::fclose(file_);
}

int64_t Timeline::Micros(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
}

void Timeline::Write(const std::string& event) {
  // Step back over the closing "]\n", append, and close the array again;
  // the seek flushes the previous event, so the file on disk always ends
  // with a complete array.
  std::fseek(file_, -2, SEEK_END);
  if (!first_event_) std::fputs(",\n", file_);
  first_event_ = false;
  std::fputs(event.c_str(), file_);
  std::fputs("\n]\n", file_);
  std::fflush(file_);
}

int Timeline::RowId(const std::string& row) {
  auto it = rows_.find(row);
  if (it != rows_.end()) return it->second;
  int id = static_cast<int>(rows_.size()) + 1;
  rows_[row] = id;
  Write("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " + std::to_string(id) +
        ", \"args\": {\"name\": " + JsonString(row) + "}}");
  return id;
}

void Timeline::Span(const std::string& row, const std::string& phase, Clock::time_point start,
                    Clock::time_point end, const std::string& args_json) {
  std::lock_guard<std::mutex> lock(mutex_);
  int tid = RowId(row);
  Write("{\"name\": " + JsonString(phase) + ", \"ph\": \"X\", \"pid\": 0, \"tid\": " +
        std::to_string(tid) + ", \"ts\": " + std::to_string(Micros(start)) + ", \"dur\": " +
        std::to_string(Micros(end) - Micros(start)) + ", \"args\": {" + args_json + "}}");
}

void Timeline::Marker(const std::string& label) {
  std::lock_guard<std::mutex> lock(mutex_);
  int tid = RowId("markers");
  Write("{\"name\": " + JsonString(label) + ", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"tid\": " +
        std::to_string(tid) + ", \"ts\": " + std::to_string(Micros(Clock::now())) + "}");
}

}  // namespace ddl
