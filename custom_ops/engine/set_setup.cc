#include "set_setup.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "../common/util.h"
#include "../transport/tags.h"
#include "../transport/wait.h"

namespace ddl {

namespace {

using Clock = std::chrono::steady_clock;

// Between probes a waiting rank naps (transport/wait.h's set-up pace):
// add_process_set is rare, and its waits may last the whole timeout.
// How long a finished round still tests its sends before leaving one in
// flight (its peer never received it: a rank that did not call).
constexpr auto kSendGrace = std::chrono::milliseconds(500);

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

// Receives the message from `peer` with `tag` once a probe shows it has
// arrived; false if it has not by `deadline` (never false without one).
bool ReceiveBy(Group& group, int peer, int tag, std::optional<Clock::time_point> deadline,
               std::string* out) {
  Backoff backoff(SetupPace());
  for (;;) {
    const int64_t bytes = group.Probe(peer, tag);
    if (bytes >= 0) {
      out->assign(static_cast<size_t>(bytes), '\0');
      group.Wait(group.Irecv(&(*out)[0], out->size(), peer, tag));
      return true;
    }
    if (deadline && Clock::now() >= *deadline) return false;
    backoff.Pause();
  }
}

// Sends in flight, with the buffers they read from.
class Sends {
 public:
  explicit Sends(Group& group) : group_(group) {}
  void Start(std::string text, int peer, int tag) {
    auto buffer = std::make_unique<std::string>(std::move(text));
    const Transport::Handle h = group_.Isend(buffer->data(), buffer->size(), peer, tag);
    pending_.emplace_back(h, std::move(buffer));
  }
  // Tests the sends for a short while. One still in flight after that
  // goes to a peer that never received it: its buffer is kept for good, so
  // the transport may still read it.
  ~Sends() {
    const auto until = Clock::now() + kSendGrace;
    for (auto& [handle, buffer] : pending_) {
      try {
        Backoff backoff(SetupPace());
        while (!group_.Test(handle) && Clock::now() < until) backoff.Pause();
        if (!group_.Test(handle)) buffer.release();  // NOLINT: left to the transport on purpose
      } catch (const TransportError&) {
        buffer.release();  // NOLINT: as above
      }
    }
  }

 private:
  Group& group_;
  std::vector<std::pair<Transport::Handle, std::unique_ptr<std::string>>> pending_;
};

// "[0, 2, 5]".
std::string Bracketed(const std::vector<int>& ranks) { return "[" + RankList(ranks) + "]"; }

// "rank 2" or "ranks [1, 3]".
std::string Ranks(const std::vector<int>& ranks) {
  return ranks.size() == 1 ? "rank " + std::to_string(ranks[0]) : "ranks " + Bracketed(ranks);
}

}  // namespace

Verdict AgreeThroughRankZero(Group& group, const std::string& offer, double timeout_s,
                             const Decide& decide) {
  const int n = group.size();
  std::optional<Clock::time_point> deadline;
  const auto limit = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(timeout_s));
  Sends sends(group);
  if (group.rank() != 0) {
    sends.Start(offer, 0, kTagSetupOffer);
    if (timeout_s > 0) deadline = Clock::now() + 2 * limit;
    std::string verdict;
    if (!ReceiveBy(group, 0, kTagSetupVerdict, deadline, &verdict) || verdict.empty()) {
      return {"no verdict from rank " + std::to_string(group.WorldRank(0)) + " within 2 x " +
                  "DDL_PEER_TIMEOUT_S (" + Seconds(2 * timeout_s) + " s): it did not make this "
                  "call, or is stuck",
              false};
    }
    return {verdict.substr(1), verdict[0] == '1'};
  }
  if (timeout_s > 0) deadline = Clock::now() + limit;
  std::vector<std::optional<std::string>> offers(n);
  offers[0] = offer;
  bool in_step = true;
  for (int r = 1; r < n; ++r) {
    std::string theirs;
    if (ReceiveBy(group, r, kTagSetupOffer, deadline, &theirs)) {
      offers[r] = std::move(theirs);
    } else {
      in_step = false;
    }
  }
  Verdict verdict{decide(offers), in_step};
  // The first byte tells the others whether the group is still in step.
  for (int r = 1; r < n; ++r) {
    sends.Start((in_step ? "1" : "0") + verdict.text, r, kTagSetupVerdict);
  }
  return verdict;
}

Status SetUpProcessSet(Group& setup, const std::vector<int>& ranks, const std::string& problem,
                       double timeout_s,
                       const std::function<Status(std::unique_ptr<Group>)>& build,
                       bool* out_of_step) {
  const std::string call = "add_process_set(" + Bracketed(ranks) + "): ";
  const std::string within = " within DDL_PEER_TIMEOUT_S (" + Seconds(timeout_s) + " s)";
  // Round 1: every rank called, with the same list, and found it valid.
  // An offer is "L" and the list, or "P" and this rank's problem with it.
  const Decide same_list = [&](const std::vector<std::optional<std::string>>& offers) {
    std::vector<int> missing;
    std::string problems;
    std::vector<std::pair<std::string, std::vector<int>>> lists;  // list, ranks passing it
    for (size_t r = 0; r < offers.size(); ++r) {
      const int rank = static_cast<int>(r);
      if (!offers[r]) {
        missing.push_back(rank);
      } else if ((*offers[r])[0] == 'P') {
        problems += (problems.empty() ? "" : "; ") + offers[r]->substr(1) + " on rank " +
                    std::to_string(rank);
      } else {
        const std::string list = offers[r]->substr(1);
        auto it = std::find_if(lists.begin(), lists.end(),
                               [&](const auto& l) { return l.first == list; });
        if (it == lists.end()) it = lists.insert(lists.end(), {list, {}});
        it->second.push_back(rank);
      }
    }
    std::string passed;  // what the ranks that called passed
    for (const auto& [list, who] : lists) {
      passed += (passed.empty() ? "" : ", ") + Ranks(who) + " passed " + list;
    }
    if (!missing.empty()) {
      return Ranks(missing) + " did not call add_process_set" + within +
             (passed.empty() ? "" : "; " + passed);
    }
    if (!problems.empty()) return problems;
    if (lists.size() > 1) {
      return "the ranks differ between ranks of the job (" + passed +
             "); every rank must pass the same list";
    }
    return std::string();
  };
  Verdict agreed = AgreeThroughRankZero(
      setup, problem.empty() ? "L" + Bracketed(ranks) : "P" + problem, timeout_s, same_list);
  if (!agreed.in_step) *out_of_step = true;
  if (!agreed.text.empty()) return Status::InvalidArgument(call + agreed.text);

  // Every rank was told to go ahead, so every rank makes the blocking split.
  const int me = setup.WorldRank(setup.rank());
  const bool member = std::binary_search(ranks.begin(), ranks.end(), me);
  std::unique_ptr<Group> group = setup.Split(member ? 0 : -1, me);
  Status built = member ? build(std::move(group)) : Status::Ok();

  // Round 2: every member built the set. "B" built (or not a member), "F"
  // and the error.
  const Decide all_built = [&](const std::vector<std::optional<std::string>>& offers) {
    std::vector<int> missing;
    std::string failures;
    for (size_t r = 0; r < offers.size(); ++r) {
      if (!offers[r]) {
        missing.push_back(static_cast<int>(r));
      } else if ((*offers[r])[0] == 'F') {
        failures += (failures.empty() ? "" : "; ") + offers[r]->substr(1);
      }
    }
    std::string text;
    if (!failures.empty()) text = "the set could not be built: " + failures;
    if (!missing.empty()) {
      text += (text.empty() ? "" : "; ") + Ranks(missing) + " did not finish building the set" +
              within;
    }
    return text;
  };
  Verdict done = AgreeThroughRankZero(setup, built.ok() ? "B" : "F" + built.message(), timeout_s,
                                      all_built);
  if (!done.in_step) *out_of_step = true;
  if (!done.text.empty()) return Status::Aborted(call + done.text);
  return Status::Ok();
}

}  // namespace ddl
