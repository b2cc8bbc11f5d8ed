// The fuzz targets (targets.h).
//
// Negotiation messages (negotiation/message.h): what a rank's peers send
// each cycle (requests to the coordinator, its responses to every rank).
// A decoded message must encode back to exactly the bytes given: nothing
// ignored, nothing trailing, nothing invented.
//
// DDL_* values (common/settings.def, read by common/config.cc): the first
// byte picks a variable of the table, the rest (up to a NUL, which no
// environment value holds) is its value. A refusal names the variable; an
// accepted value can be shown (the agreed settings' text).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/config.h"
#include "negotiation/message.h"
#include "targets.h"

namespace ddl_fuzz {

namespace {

// The refusals a decoder may give; anything else is a finding.
bool Named(const std::runtime_error& e) {
  const std::string what = e.what();
  return what == "truncated negotiation message" ||
         what.rfind("malformed negotiation message: ", 0) == 0;
}

ddl::Request Sample(const std::string& name, int rank) {
  ddl::Request r;
  r.name = name;
  r.rank = rank;
  r.collective = ddl::Collective::kAllgather;
  r.dtype = ddl::DataType::kFloat16;
  r.wire = ddl::DataType::kFloat16;
  r.op = ddl::ReduceOp::kMax;
  r.root = 2;
  r.shape = {3, 4, 5};
  r.invalid = rank == 1 ? "" : "splits do not fit";
  return r;
}

std::string Text(const std::vector<char>& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::string Requests(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(data, data + size);
  std::vector<ddl::Request> decoded;
  try {
    decoded = ddl::DecodeRequests(bytes);
  } catch (const std::runtime_error& e) {
    if (!Named(e)) Fail(std::string("requests: unnamed refusal: ") + e.what(), data, size);
    return e.what();
  }
  // An empty message is "no requests" (a rank with nothing to offer).
  if (size == 0 ? !decoded.empty() : ddl::EncodeRequests(decoded) != bytes) {
    Fail("requests: decoded, but does not encode back to the same bytes", data, size);
  }
  return "";
}

std::string Responses(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(data, data + size);
  ddl::ResponseList decoded;
  try {
    decoded = ddl::DecodeResponses(bytes);
  } catch (const std::runtime_error& e) {
    if (!Named(e)) Fail(std::string("responses: unnamed refusal: ") + e.what(), data, size);
    return e.what();
  }
  if (ddl::EncodeResponses(decoded) != bytes) {
    Fail("responses: decoded, but does not encode back to the same bytes", data, size);
  }
  return "";
}

const std::vector<const char*>& SettingNames() {
  static const std::vector<const char*> names = {
#define DDL_NUMBER(var, ...) #var,
#define DDL_WHOLE(var, ...) #var,
#define DDL_CHOICE(var, ...) #var,
#define DDL_TEXT(var, ...) #var,
#include "common/settings.def"
#undef DDL_NUMBER
#undef DDL_WHOLE
#undef DDL_CHOICE
#undef DDL_TEXT
  };
  return names;
}

std::string Settings(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const char* var = SettingNames()[data[0] % SettingNames().size()];
  const std::string value(reinterpret_cast<const char*>(data) + 1,
                          strnlen(reinterpret_cast<const char*>(data) + 1, size - 1));
  setenv(var, value.c_str(), 1);
  ddl::Config config;
  const ddl::Status s = ddl::Config::FromEnvironment(&config);
  unsetenv(var);
  if (!s.ok()) {
    if (s.message().rfind(std::string("environment variable ") + var, 0) != 0) {
      Fail(std::string("settings: a refusal of ") + var + " that does not name it: " +
               s.message(), data, size);
    }
    return s.message();
  }
  config.SharedSettings();  // throws (a finding) on a value it cannot show
  return "";
}

std::vector<std::string> SettingSeeds() {
  std::vector<std::string> seeds;
  const char* values[] = {"1.5", "64", "auto", "flat", "0", "1e9", "/tmp/x",
                          "00112233445566778899aabbccddeeff"};
  for (size_t i = 0; i < SettingNames().size(); ++i) {
    seeds.push_back(std::string(1, static_cast<char>(i)) + values[i % 8]);
  }
  return seeds;
}

std::vector<std::string> RequestSeeds() {
  return {Text(ddl::EncodeRequests({})), Text(ddl::EncodeRequests({Sample("grad/0", 1)})),
          Text(ddl::EncodeRequests({Sample("a", 0), Sample("layer/kernel:0", 3)}))};
}

std::vector<std::string> ResponseSeeds() {
  ddl::ResponseList full;
  full.ready = {"a", "b/c"};
  full.errors = {{"x", "shape [3] on rank 0 but [4] on rank 1"}};
  full.evictions = {"old"};
  full.fatal = "";
  full.stand_ins = {Sample("a", 1), Sample("b/c", 0)};
  ddl::ResponseList fatal;
  fatal.fatal = "stall timeout";
  return {Text(ddl::EncodeResponses({})), Text(ddl::EncodeResponses(full)),
          Text(ddl::EncodeResponses(fatal))};
}

}  // namespace

const std::vector<NamedTarget>& Targets() {
  static const std::vector<NamedTarget> targets = {
      {"negotiation_requests", Requests, RequestSeeds},
      {"negotiation_responses", Responses, ResponseSeeds},
      {"ddl_settings", Settings, SettingSeeds},
  };
  return targets;
}

void Fail(const std::string& what, const uint8_t* data, size_t size) {
  std::fprintf(stderr, "FUZZ FINDING: %s\ninput (%zu bytes):", what.c_str(), size);
  for (size_t i = 0; i < size && i < 4096; ++i) std::fprintf(stderr, " %02x", data[i]);
  std::fprintf(stderr, "\n");
  std::abort();
}

}  // namespace ddl_fuzz
