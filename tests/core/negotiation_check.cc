// The engine's negotiation (negotiation/controller.h over the coordinator and
// the response cache) with threads as ranks (tests/core/in_process.h):
// every rank runs its own Controller through the same number of cycles,
// offering requests on its own schedule, and the outcomes are compared
// across ranks. Prints one line per failure and "<N> checks, <F> failures".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <thread>

#include "negotiation/controller.h"
#include "negotiation/message.h"
#include "check.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

Request Make(const std::string& name, int rank, std::vector<int64_t> shape = {4},
             DataType dtype = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.name = name;
  r.rank = rank;
  r.dtype = r.wire = dtype;
  r.op = op;
  r.shape = std::move(shape);
  return r;
}

// offers(rank, cycle) -> requests that rank offers before that cycle.
using Schedule = std::function<std::vector<Request>(int rank, int cycle)>;

// outcomes[rank][cycle].
std::vector<std::vector<Negotiated>> Drive(int n, int cycles, const Schedule& offers,
                                           Config config = Config(),
                                           std::function<bool(int, int)> shutting = nullptr,
                                           std::chrono::milliseconds pause = {},
                                           std::function<bool(int, int)> joined = nullptr) {
  InProcessGroup group(n, 1 << 20);
  std::vector<std::vector<Negotiated>> out(n);
  group.Run([&](int r) {
    InProcessRank plane(group, r);
    Controller controller(plane, config);
    for (int c = 0; c < cycles; ++c) {
      for (const Request& q : offers(r, c)) {
        if (!controller.Offer(q)) throw std::runtime_error("duplicate offer of " + q.name);
      }
      controller.SetJoined(joined && joined(r, c));
      out[r].push_back(controller.Negotiate(shutting && shutting(r, c)));
      if (pause.count()) std::this_thread::sleep_for(pause);
    }
  });
  return out;
}

bool SameRuns(const std::vector<std::vector<Negotiated>>& out, int cycle) {
  for (size_t r = 1; r < out.size(); ++r) {
    if (out[r][cycle].run != out[0][cycle].run) return false;
  }
  return true;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Ranks offer the same names in different orders; the first cycle names
// them, later rounds go through the cache bits only.
void OutOfOrderNamesRunInOneOrderThenFromTheCache() {
  const int n = 3;
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  auto schedule = [&](int r, int c) {
    std::vector<Request> rq;
    if (c % 2) return rq;  // rounds at cycles 0, 2, 4
    for (size_t i = 0; i < names.size(); ++i) rq.push_back(Make(names[(i + r * 2) % names.size()], r));
    return rq;
  };
  auto out = Drive(n, 6, schedule);
  for (int c = 0; c < 6; ++c) Expect(SameRuns(out, c), "out of order: cycle " + std::to_string(c) + " runs differ");
  std::vector<std::string> sorted = out[0][0].run;
  std::sort(sorted.begin(), sorted.end());
  Expect(sorted == names, "out of order: every name runs in the first cycle");
  Expect(out[0][0].exchanged, "out of order: the first round goes by name");
  for (int c : {2, 4}) {
    Expect(out[0][c].run.size() == names.size(), "out of order: round at cycle " + std::to_string(c) + " runs all");
    for (int r = 0; r < n; ++r) {
      Expect(!out[r][c].exchanged, "out of order: cached round at cycle " + std::to_string(c) +
                                       " needs no exchange on rank " + std::to_string(r));
    }
  }
}

// A name runs in the cycle its last rank offers it, on every rank at once.
void StaggeredOffersRunWhenTheLastRankArrives() {
  auto schedule = [](int r, int c) {
    return c == 2 * r ? std::vector<Request>{Make("x", r)} : std::vector<Request>{};
  };
  auto out = Drive(3, 6, schedule);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 6; ++c) {
      const bool ran = out[r][c].run == std::vector<std::string>{"x"};
      Expect(ran == (c == 4), "staggered: rank " + std::to_string(r) + " cycle " +
                                  std::to_string(c) + (c == 4 ? " should run x" : " should not run x"));
    }
  }
}

// Mismatched shapes, an integer Average and a changed cached request: the
// name is refused on every rank, in the same cycle, with the difference.
void MismatchesAreRefusedOnEveryRank() {
  const int n = 3;
  auto schedule = [](int r, int c) {
    std::vector<Request> rq;
    if (c == 0) {
      rq.push_back(Make("w", r, {r == 1 ? 4 : 3}));
      rq.push_back(Make("avg", r, {2}, DataType::kInt32, ReduceOp::kAverage));
      rq.push_back(Make("k", r));
    }
    // "k" is cached after cycle 0; rank 2 then offers it as float64.
    if (c == 2) rq.push_back(Make("k", r, {4}, r == 2 ? DataType::kFloat64 : DataType::kFloat32));
    return rq;
  };
  auto out = Drive(n, 8, schedule);
  for (int r = 0; r < n; ++r) {
    auto refused = [&](int c, const std::string& name) -> std::string {
      for (auto& [nm, msg] : out[r][c].refused) if (nm == name) return msg;
      return "";
    };
    const std::string w = refused(0, "w"), avg = refused(0, "avg");
    Expect(Contains(w, "shape") && Contains(w, "'w'"),
           "mismatch: rank " + std::to_string(r) + " refuses w naming the shape: '" + w + "'");
    Expect(Contains(avg, "Average") && Contains(avg, "int32"),
           "mismatch: rank " + std::to_string(r) + " refuses the integer Average: '" + avg + "'");
    Expect(out[r][0].run == std::vector<std::string>{"k"}, "mismatch: k runs in cycle 0 on rank " + std::to_string(r));
    int refused_at = -1, ran_at = -1;
    for (int c = 2; c < 8; ++c) {
      if (!refused(c, "k").empty() && refused_at < 0) refused_at = c;
      if (std::count(out[r][c].run.begin(), out[r][c].run.end(), "k")) ran_at = c;
    }
    Expect(ran_at < 0, "changed cached request: k must not run again on rank " + std::to_string(r));
    Expect(refused_at >= 0 && Contains(refused(refused_at, "k"), "float64"),
           "changed cached request: rank " + std::to_string(r) + " refuses k naming the dtype");
    Expect(refused_at == [&] { for (int c = 2; c < 8; ++c) if (!out[0][c].refused.empty()) return c; return -1; }(),
           "changed cached request: refused in the same cycle on rank " + std::to_string(r));
  }
}

// More names than cache slots: they still run, identically everywhere.
void ASmallCacheEvictsAndStillAgrees() {
  Config config;
  config.cache_capacity = 2;
  auto schedule = [](int r, int c) {
    std::vector<Request> rq;
    for (int i = 0; i < 5; ++i) rq.push_back(Make("t" + std::to_string((i + c + r) % 5), r));
    return rq;
  };
  auto out = Drive(3, 4, schedule, config);
  int total = 0;
  for (int c = 0; c < 4; ++c) {
    Expect(SameRuns(out, c), "small cache: cycle " + std::to_string(c) + " runs differ");
    total += static_cast<int>(out[0][c].run.size());
  }
  Expect(total == 20, "small cache: 20 runs over 4 rounds, got " + std::to_string(total));
}

// A name one rank never offers: past DDL_STALL_TIMEOUT_S every rank gets
// the same fatal verdict, naming the rank that is missing.
void AStallTimesOutNamingTheMissingRank() {
  Config config;
  config.stall_warning_s = 0.1;
  config.stall_timeout_s = 0.4;
  auto schedule = [](int r, int c) {
    return c == 0 && r != 2 ? std::vector<Request>{Make("s", r)} : std::vector<Request>{};
  };
  auto out = Drive(3, 30, schedule, config, nullptr, std::chrono::milliseconds(40));
  int fatal_at = -1;
  for (int c = 0; c < 30 && fatal_at < 0; ++c) if (!out[0][c].fatal.empty()) fatal_at = c;
  Expect(fatal_at > 0, "stall: a fatal verdict within 1.2 s");
  if (fatal_at > 0) {
    for (int r = 0; r < 3; ++r) {
      Expect(out[r][fatal_at].fatal == out[0][fatal_at].fatal,
             "stall: rank " + std::to_string(r) + " gets the same verdict in the same cycle");
    }
    Expect(Contains(out[0][fatal_at].fatal, "'s'"),
           "stall: the verdict names the tensor");
    Expect(Contains(out[0][fatal_at].fatal, "2"), "stall: the verdict names rank 2: " + out[0][fatal_at].fatal);
  }
}

// One rank asks to shut down: every rank sees it in that cycle and all
// name the same rank.
void ShutdownIsSeenByEveryRank() {
  const int n = 3;
  InProcessGroup group(n, 1 << 20);
  std::vector<std::string> who(n);
  std::vector<int> seen_at(n, -1);
  group.Run([&](int r) {
    InProcessRank plane(group, r);
    Controller controller(plane, Config());
    for (int c = 0; c < 5; ++c) {
      const bool me = r == 1 && c == 3;
      if (controller.Negotiate(me).shutdown) {
        seen_at[r] = c;
        who[r] = controller.RanksShuttingDown(me);
        break;
      }
    }
  });
  for (int r = 0; r < n; ++r) {
    Expect(seen_at[r] == 3, "shutdown: rank " + std::to_string(r) + " sees it in cycle 3");
    Expect(who[r] == "rank(s) [1]", "shutdown: rank " + std::to_string(r) + " names rank 1: " + who[r]);
  }
}

void ADuplicateNameIsRefusedLocally() {
  InProcessGroup group(1, 1 << 20);
  InProcessRank plane(group, 0);
  Controller controller(plane, Config());
  Expect(controller.Offer(Make("dup", 0)), "duplicate: the first offer is accepted");
  Expect(!controller.Offer(Make("dup", 0)), "duplicate: the second offer is refused");
  Expect(controller.Negotiate(false).run == std::vector<std::string>{"dup"}, "duplicate: one run");
  Expect(!controller.HasPending(), "duplicate: nothing pending after the run");
}

// Joined ranks (ddl.join) stand in for what the others still run: a cached
// name through the AND bits, a new name by the coordinator's answer, and a
// name offered before the join once the join completes it. An alltoall and
// a broadcast from a joined root are refused; the join ends on every rank
// in the cycle the last rank joins.
void JoinedRanksStandInUntilEveryRankJoined() {
  const int n = 3;
  auto join_cycle = [](int r) { return r == 2 ? 1 : r == 1 ? 3 : 6; };
  auto joined = [&](int r, int c) { return c >= join_cycle(r) && c < 7; };
  auto schedule = [&](int r, int c) {
    std::vector<Request> rq;
    if (c == 0 || (c == 1 && r < 2)) rq.push_back(Make("a", r, {4}, DataType::kFloat32, ReduceOp::kAverage));
    if (c == 2 && r == 0) rq.push_back(Make("b", r, {2, 3}));
    if (c == 5 && r == 0) {
      Request x = Make("x", r, {3});
      x.collective = Collective::kAlltoall;
      Request y = Make("y", r, {3});
      y.collective = Collective::kBroadcast;
      y.root = 1;
      rq = {x, y};
    }
    return rq;
  };
  auto out = Drive(n, 8, schedule, Config(), nullptr, {}, joined);
  for (int c = 0; c < 8; ++c) {
    Expect(SameRuns(out, c), "join: every rank runs the same names in cycle " + std::to_string(c));
  }
  const std::vector<int> active = {3, 2, 2, 1, 1, 1, 3, 3};
  for (int r = 0; r < n; ++r) {
    const std::string who = "join: rank " + std::to_string(r);
    for (int c = 0; c < 8; ++c) {
      Expect(out[r][c].active == active[c], who + " cycle " + std::to_string(c) + ": active " +
                                                std::to_string(out[r][c].active));
      Expect(out[r][c].all_joined == (c == 6), who + " cycle " + std::to_string(c) + ": all_joined");
    }
    Expect(out[r][6].last_joined == 0, who + ": the last to join was rank 0");
    // Every rank joined agrees to every cached name, but nobody offered one.
    Expect(out[r][6].run.empty() && out[r][6].stand_ins.empty(),
           who + ": nothing runs in the cycle everyone has joined");
    Expect(out[r][1].run == std::vector<std::string>{"a"}, who + ": cached a runs in cycle 1");
    const bool b_ran = out[r][4].run == std::vector<std::string>{"b"};
    Expect(b_ran, who + ": b, offered before rank 1 joined, runs once the join completes it");
    // Stand-ins: only ranks that had joined, with the metadata of a rank that offered.
    const auto& a_in = out[r][1].stand_ins;
    Expect((a_in.count("a") == 1) == (r == 2), who + ": stand-in for a only on rank 2");
    if (r == 2 && a_in.count("a")) {
      Expect(a_in.at("a").op == ReduceOp::kAverage && a_in.at("a").shape == std::vector<int64_t>{4},
             who + ": a's stand-in has its op and shape");
    }
    const auto& b_in = out[r][4].stand_ins;
    Expect((b_in.count("b") == 1) == (r != 0), who + ": stand-in for b on ranks 1 and 2");
    if (b_in.count("b")) {
      Expect(b_in.at("b").shape == (std::vector<int64_t>{2, 3}), who + ": b's stand-in shape");
    }
  }
  std::string refusals;
  for (const auto& [name, message] : out[0][5].refused) refusals += name + ": " + message + "\n";
  Expect(Contains(refusals, "x: alltoall") && Contains(refusals, "have joined"),
         "join: alltoall refused while ranks have joined, got " + refusals);
  Expect(Contains(refusals, "y: broadcast") && Contains(refusals, "root_rank=1 has joined"),
         "join: broadcast from a joined root refused, got " + refusals);
  Expect(out[1][5].refused.empty() && out[2][5].refused.empty(),
         "join: joined ranks had nothing to refuse");
}

}  // namespace

// An allgather whose output would exceed 2^31 - 1 bytes (MPI's int counts
// and displacements) is refused on every rank in the same cycle, naming
// the tensor, every rank's bytes and the limit; one of exactly 2^31 - 1
// bytes runs; sizes whose product passes 2^64 do not wrap around into a
// small total. No buffer is allocated: only the negotiation runs.
void AnAllgatherOverTwoGigabytesIsRefusedOnEveryRank() {
  const int n = 3;
  auto gather = [](const std::string& name, int r, std::vector<int64_t> shape,
                   DataType dtype = DataType::kFloat32) {
    Request q = Make(name, r, std::move(shape), dtype);
    q.collective = Collective::kAllgather;
    return q;
  };
  auto schedule = [&](int r, int c) {
    std::vector<Request> rq;
    if (c != 0) return rq;
    // 200 rows of 4 MB each: 800 MB per rank, 2.4 GB in all.
    rq.push_back(gather("big", r, {200, 1024, 1024}));
    // Exactly the limit, in bytes: runs.
    const int64_t rows[3] = {1000000000, 1147483647, 0};
    rq.push_back(gather("edge", r, {rows[r]}, DataType::kUInt8));
    // One row more than the limit.
    const int64_t over[3] = {1000000000, 1147483648, 0};
    rq.push_back(gather("edge+1", r, {over[r]}, DataType::kUInt8));
    // 2^40 rows of 2^40 floats on rank 1, none elsewhere: a 64-bit
    // product wraps to 0 bytes.
    rq.push_back(gather("wraps", r, {r == 1 ? int64_t(1) << 40 : 0, int64_t(1) << 40}));
    return rq;
  };
  auto out = Drive(n, 2, schedule);
  for (int r = 0; r < n; ++r) {
    const std::string who = "allgather over 2 GB, rank " + std::to_string(r) + ": ";
    Expect(out[r][0].run == std::vector<std::string>{"edge"},
           who + "only the gather of exactly 2^31 - 1 bytes runs");
    std::map<std::string, std::string> refused(out[r][0].refused.begin(), out[r][0].refused.end());
    Expect(refused.size() == 3, who + "three names refused in the first cycle");
    const std::string& big = refused["big"];
    Expect(Contains(big, "allgather of tensor 'big'") && Contains(big, "2516582400 bytes") &&
               Contains(big, "rank 0: 838860800") && Contains(big, "rank 2: 838860800") &&
               Contains(big, "2147483647"),
           who + "the refusal names the tensor, the total, each rank's bytes and the limit: " + big);
    Expect(Contains(refused["edge+1"], "2147483648 bytes"), who + "one byte over: " + refused["edge+1"]);
    Expect(Contains(refused["wraps"], "more than 2^64"), who + "no wrap-around: " + refused["wraps"]);
  }
  Expect(out[0][0].refused == out[1][0].refused && out[1][0].refused == out[2][0].refused,
         "allgather over 2 GB: every rank gets the same refusals");
}

// A message with a byte after its end is refused, naming which message
// and where it ended, as is one cut short; the same bytes without the
// extra one decode to what was encoded.
void TrailingOrMissingBytesAreRefused() {
  ddl::Request r;
  r.name = "grad/w";
  r.rank = 2;
  r.shape = {3, 4};
  std::vector<char> requests = ddl::EncodeRequests({r});
  const std::vector<ddl::Request> back = ddl::DecodeRequests(requests);
  Expect(back.size() == 1 && back[0].name == "grad/w" && back[0].rank == 2 &&
             back[0].shape == std::vector<int64_t>{3, 4},
         "a request decodes to what was encoded");
  auto refusal = [](auto decode, const std::vector<char>& bytes) -> std::string {
    try {
      decode(bytes);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  std::vector<char> longer = requests;
  longer.push_back('x');
  const std::string why = refusal(ddl::DecodeRequests, longer);
  Expect(why.find("negotiation message: requests has") != std::string::npos &&
             why.find("1 byte(s) after its end") != std::string::npos,
         "a request list with a trailing byte is refused, naming it: '" + why + "'");
  ddl::ResponseList list;
  list.ready = {"a", "b"};
  list.fatal = "";
  std::vector<char> responses = ddl::EncodeResponses(list);
  Expect(ddl::DecodeResponses(responses).ready == list.ready, "a response list decodes back");
  responses.push_back('\0');
  const std::string why2 = refusal(ddl::DecodeResponses, responses);
  Expect(why2.find("negotiation message: responses has") != std::string::npos &&
             why2.find("1 byte(s) after its end") != std::string::npos,
         "a response list with a trailing byte is refused, naming it: '" + why2 + "'");
  responses.resize(responses.size() - 3);
  Expect(refusal(ddl::DecodeResponses, responses) == "truncated negotiation message",
         "a response list cut short is refused as truncated");
}

int main() {
  OutOfOrderNamesRunInOneOrderThenFromTheCache();
  StaggeredOffersRunWhenTheLastRankArrives();
  MismatchesAreRefusedOnEveryRank();
  ASmallCacheEvictsAndStillAgrees();
  AStallTimesOutNamingTheMissingRank();
  ShutdownIsSeenByEveryRank();
  ADuplicateNameIsRefusedLocally();
  JoinedRanksStandInUntilEveryRankJoined();
  AnAllgatherOverTwoGigabytesIsRefusedOnEveryRank();
  TrailingOrMissingBytesAreRefused();
  return ddl_test::Summary();
}
