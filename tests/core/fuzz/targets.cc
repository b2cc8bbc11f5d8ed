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
//
// The settings agreement (common/config.h): a rank's shared values, as
// rank 0 reads them to compare (the first byte picks how many values the
// reader expects).
//
// The probe channel (health/probe_wire.h): rank 0's broadcast of the
// group's secret and every rank's identity (the first byte picks the
// group's size), each identity decoded too; and a responder's answer.
//
// The autotune table file (tuning/autotune.h): read by a tuner of a
// fixed shape, candidates and settings. An accepted table must save
// (Serialize) to a text that reads back to the same values.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/config.h"
#include "health/probe_wire.h"
#include "negotiation/message.h"
#include "tuning/autotune.h"
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
  // putenv, not setenv: glibc keeps every string setenv was given (ten
  // minutes of inputs took gigabytes); putenv holds this buffer, which
  // unsetenv lets go of before the next input rewrites it.
  static std::string entry;
  entry = std::string(var) + "=" + value;
  putenv(entry.data());
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

bool StartsWith(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

std::string SharedValues(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const size_t count = data[0] % 40;
  const std::vector<char> bytes(data + 1, data + size);
  std::vector<std::string> values;
  const ddl::Status s = ddl::DecodeSharedValues(bytes, count, &values);
  if (!s.ok()) {
    if (!StartsWith(s.message(), "malformed shared settings: ")) {
      Fail("shared settings: unnamed refusal: " + s.message(), data, size);
    }
    return s.message();
  }
  std::vector<std::pair<std::string, std::string>> named;
  for (const std::string& v : values) named.emplace_back("DDL_X", v);
  if (values.size() != count || ddl::EncodeSharedValues(named) != bytes) {
    Fail("shared settings: decoded, but does not encode back to the same bytes", data, size);
  }
  return "";
}

std::vector<std::string> SharedValueSeeds() {
  ddl::Config config;
  const auto settings = config.SharedSettings();
  const std::vector<char> bytes = ddl::EncodeSharedValues(settings);
  return {std::string(1, static_cast<char>(settings.size())) + Text(bytes),
          std::string(1, '\3') + std::string("auto\0" "64\0" "\0", 9),
          std::string(1, '\0')};
}

std::string Identities(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const size_t count = data[0] % 5;
  const std::vector<char> bytes(data + 1, data + size);
  std::string secret;
  std::vector<std::string> texts;
  ddl::Status s = ddl::SplitIdentities(bytes, count, &secret, &texts);
  std::vector<std::vector<char>> encoded;
  for (size_t r = 0; s.ok() && r < texts.size(); ++r) {
    ddl::PeerIdentity p;
    s = ddl::DecodeIdentity(texts[r], static_cast<int>(r), &p);
    const std::string back = ddl::EncodeIdentity(p);
    if (s.ok() && back != texts[r]) {
      Fail("probe identity: decoded, but does not encode back to the same bytes", data, size);
    }
    encoded.emplace_back(back.begin(), back.end());
  }
  if (!s.ok()) {
    if (!StartsWith(s.message(), "malformed probe identit")) {
      Fail("probe identities: unnamed refusal: " + s.message(), data, size);
    }
    return s.message();
  }
  if (texts.size() != count || ddl::EncodeIdentities(secret, encoded) != bytes) {
    Fail("probe identities: decoded, but do not encode back to the same bytes", data, size);
  }
  return "";
}

std::vector<std::string> IdentitySeeds() {
  ddl::PeerIdentity a;
  a.host = "node1";
  a.pid = 4242;
  a.port = 40001;
  a.addresses = {"10.0.0.1", "192.168.7.20"};
  ddl::PeerIdentity b;
  b.host = "a-much-longer-host.example.org";
  b.pid = 1;
  b.port = 0;
  const std::string ea = ddl::EncodeIdentity(a), eb = ddl::EncodeIdentity(b);
  const std::string secret = "0123456789abcdef";
  return {std::string(1, '\2') + Text(ddl::EncodeIdentities(
              secret, {std::vector<char>(ea.begin(), ea.end()),
                       std::vector<char>(eb.begin(), eb.end())})),
          std::string(1, '\1') + Text(ddl::EncodeIdentities(
              secret, {std::vector<char>(eb.begin(), eb.end())})),
          std::string(1, '\0') + secret};
}

std::string Answer(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ddl::ProbeAnswer answer;
  const ddl::Status s = ddl::DecodeProbeAnswer(bytes, &answer);
  if (!s.ok()) {
    if (!StartsWith(s.message(), "malformed probe answer: ")) {
      Fail("probe answer: unnamed refusal: " + s.message(), data, size);
    }
    return s.message();
  }
  if (ddl::EncodeProbeAnswer(answer) != bytes) {
    Fail("probe answer: decoded, but does not encode back to the same bytes", data, size);
  }
  return "";
}

std::vector<std::string> AnswerSeeds() {
  ddl::ProbeAnswer busy;
  busy.lines = {{0, 0, 12, true, 1048576}, {3, 1, 7, false, 0}};
  ddl::ProbeAnswer ending = busy;
  ending.ending = true;
  ending.lines.push_back({2147483647, 2147483647, UINT64_MAX, true, UINT64_MAX});
  return {ddl::EncodeProbeAnswer({}), ddl::EncodeProbeAnswer(busy),
          ddl::EncodeProbeAnswer(ending)};
}

// A control plane of one rank: the tuner is built, never started.
class OneRank : public ddl::ControlPlane {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int WorldRank(int r) const override { return r; }
  void AllreduceBitwiseAnd(std::vector<uint64_t>&, bool) override {}
  std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine, int) override {
    return {mine};
  }
  void BroadcastBytes(std::vector<char>&, int) override {}
  std::vector<int64_t> AllgatherInt64(int64_t mine) override { return {mine}; }
};

ddl::Autotuner& Tuner() {
  static OneRank plane;
  static ddl::Autotuner* tuner = [] {
    auto* t = new ddl::Autotuner(
        plane,
        {{"DIRECT_EXCHANGE", ddl::NetworkChoice::kDirectExchange, 1},
         {"PAIRWISE_RING", ddl::NetworkChoice::kPairwiseRing},
         {"RACK_ALLREDUCE_1M", ddl::NetworkChoice::kRackPipeline1M}},
        5, "world", "4 ranks, 2 nodes", "", [](const std::string&) {});
    t->TuneSettings({{64, 1}, {128, 2.5}, {16, 0.5}}, 5);
    return t;
  }();
  return *tuner;
}

std::string Table(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ddl::AutotuneTable table, again;
  std::string why;
  if (!Tuner().Parse(text, &table, &why)) {
    if (why.empty()) Fail("autotune table: refused without a reason", data, size);
    return why;
  }
  // Saved with %.9g, a value reads back within its 9 digits: saved once
  // more, it must read back to exactly the values saved.
  const std::string saved = Tuner().Serialize(table);
  if (!Tuner().Parse(saved, &again, &why)) {
    Fail("autotune table: accepted, but its saved form is refused: " + why, data, size);
  }
  const std::string twice = Tuner().Serialize(again);
  if (twice != saved || again.chosen != table.chosen ||
      again.setting_chosen != table.setting_chosen) {
    Fail("autotune table: accepted, but does not save and read back the same", data, size);
  }
  for (size_t c = 0; c < table.median.size(); ++c) {
    if (table.median[c].size() != again.median[c].size()) {
      Fail("autotune table: a class's medians changed in number", data, size);
    }
  }
  return "";
}

std::vector<std::string> TableSeeds() {
  ddl::AutotuneTable t;
  const double nan = std::nan("");
  t.median = {{1e-4, 2e-4, 3e-4}, {2e-3, 1e-3, nan}, {nan, 0.01, 0.02}, {nan, 0.5, 0.25},
              {nan, nan, nan}};
  t.chosen = {0, 1, 1, 2, -1};
  t.setting_score = {1.5e9, 2.25e9, nan};
  t.setting_chosen = 1;
  ddl::AutotuneTable empty = t;
  empty.setting_chosen = -1;
  return {Tuner().Serialize(t), Tuner().Serialize(empty)};
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
      {"settings_agreement", SharedValues, SharedValueSeeds},
      {"probe_identities", Identities, IdentitySeeds},
      {"probe_answer", Answer, AnswerSeeds},
      {"autotune_table", Table, TableSeeds},
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
