#include "config.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "job_secret.h"

namespace ddl {

namespace {

// The scope column of the settings table.
constexpr bool SHARED = true;
constexpr bool PER_RANK = false;

Status Invalid(const char* var, const char* value, const std::string& expected) {
  return Status::InvalidArgument(std::string("environment variable ") + var + "='" + value +
                                 "' is invalid: expected " + expected);
}

// Parses a finite number within [low, high]; unset leaves *out unchanged.
Status ReadNumber(const char* var, double low, double high, const std::string& expected,
                  double* out) {
  const char* value = std::getenv(var);
  if (value == nullptr) return Status::Ok();
  char* end = nullptr;
  errno = 0;
  double parsed = std::strtod(value, &end);
  if (end == value || *end != '\0' || errno != 0 || !std::isfinite(parsed) || parsed < low ||
      parsed > high) {
    return Invalid(var, value, expected);
  }
  *out = parsed;
  return Status::Ok();
}

// ReadNumber, for a whole number.
Status ReadWhole(const char* var, double low, double high, const std::string& expected,
                 int* out) {
  double parsed = *out;
  Status s = ReadNumber(var, low, high, expected, &parsed);
  if (!s.ok()) return s;
  if (parsed != std::floor(parsed)) return Invalid(var, std::getenv(var), expected);
  *out = static_cast<int>(parsed);
  return Status::Ok();
}

std::vector<std::string> Words(const char* words) {
  std::istringstream in(words);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// One of `words` (space-separated), kept as the word: the layer that acts
// on it reads it by name (ChoiceNamed), so the words' order means nothing.
Status ReadChoice(const char* var, const char* words, const std::string& expected,
                  std::string* out) {
  const char* value = std::getenv(var);
  if (value == nullptr) return Status::Ok();
  for (const std::string& word : Words(words)) {
    if (word == value) {
      *out = word;
      return Status::Ok();
    }
  }
  return Invalid(var, value, expected);
}

std::string Show(double value, double, double) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}
// A whole number below its range is the default that means "unset".
std::string Show(int value, double low, double) {
  return value < low ? "unset" : std::to_string(value);
}
}  // namespace

Status Config::FromEnvironment(Config* c) {
  Status s;
  // One step per row of the table, in its order: the first bad value is
  // the one reported.
#define DDL_NUMBER(var, field, low, high, expected, scope) \
  if (!(s = ReadNumber(#var, low, high, expected, &c->field)).ok()) return s;
#define DDL_WHOLE(var, field, low, high, expected, scope) \
  if (!(s = ReadWhole(#var, low, high, expected, &c->field)).ok()) return s;
#define DDL_CHOICE(var, field, words, expected, scope) \
  if (!(s = ReadChoice(#var, words, expected, &c->field)).ok()) return s;
#define DDL_TEXT(var, field, expected, scope) \
  if (const char* value = std::getenv(#var)) c->field = value;
#include "settings.def"
#undef DDL_NUMBER
#undef DDL_WHOLE
#undef DDL_CHOICE
#undef DDL_TEXT
  // A text row whose form is checked here, without echoing the value.
  std::string secret;
  if (!c->job_secret.empty()) return ParseJobSecret(c->job_secret, &secret);
  return Status::Ok();
}

std::vector<std::pair<std::string, std::string>> Config::SharedSettings() const {
  std::vector<std::pair<std::string, std::string>> out;
#define DDL_NUMBER(var, field, low, high, expected, scope) \
  if (scope) out.emplace_back(#var, Show(field, low, high));
#define DDL_WHOLE DDL_NUMBER
#define DDL_CHOICE(var, field, words, expected, scope) \
  if (scope) out.emplace_back(#var, field);
#define DDL_TEXT(var, field, expected, scope) \
  if (scope) out.emplace_back(#var, field);
#include "settings.def"
#undef DDL_NUMBER
#undef DDL_WHOLE
#undef DDL_CHOICE
#undef DDL_TEXT
  return out;
}

std::vector<char> EncodeSharedValues(
    const std::vector<std::pair<std::string, std::string>>& settings) {
  std::vector<char> bytes;
  for (const auto& [name, value] : settings) {
    bytes.insert(bytes.end(), value.begin(), value.end());
    bytes.push_back('\0');
  }
  return bytes;
}

Status DecodeSharedValues(const std::vector<char>& bytes, size_t count,
                          std::vector<std::string>* values) {
  auto refuse = [&](const std::string& what) {
    return Status::InvalidArgument("malformed shared settings: " + what);
  };
  values->clear();
  size_t start = 0;
  for (size_t at = 0; at < bytes.size(); ++at) {
    if (bytes[at] != '\0') continue;
    // Counted before the value is kept: a peer's bytes never make more
    // than `count` strings here.
    if (values->size() == count) {
      return refuse(std::to_string(bytes.size() - start) + " byte(s) after the " +
                    std::to_string(count) + " values this build shares");
    }
    if (at - start > kMaxSharedValueBytes) {
      return refuse("value " + std::to_string(values->size() + 1) + " has " +
                    std::to_string(at - start) + " bytes, more than any setting's " +
                    std::to_string(kMaxSharedValueBytes));
    }
    values->emplace_back(bytes.data() + start, at - start);
    start = at + 1;
  }
  if (start != bytes.size() && values->size() == count) {
    return refuse(std::to_string(bytes.size() - start) + " byte(s) after the " +
                  std::to_string(count) + " values this build shares");
  }
  if (start != bytes.size()) {
    return refuse("cut short: " + std::to_string(bytes.size() - start) +
                  " byte(s) after value " + std::to_string(values->size()) + " without their end");
  }
  if (values->size() != count) {
    return refuse(std::to_string(values->size()) + " values where this build shares " +
                  std::to_string(count) + " (another keras_ddl build's settings table?)");
  }
  return Status::Ok();
}

}  // namespace ddl
