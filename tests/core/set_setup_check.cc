// add_process_set's agreement (engine/set_setup.h) with threads as ranks:
// a rank that never calls, rank 0 missing, lists that differ, a build that
// fails on one rank, and a late caller. Every rank that calls gets an
// error within the timeout (twice it when rank 0 is the one missing), never
// a hang. Prints "<N> checks, <F> failures".
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "check.h"
#include "engine/set_setup.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

using Clock = std::chrono::steady_clock;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Outcome {
  bool called = false;
  Status status;
  bool out_of_step = false;
  double seconds = 0;
  int built_size = -1;  // the set's size as the member's build saw it
};

// Runs add_process_set on n threads as ranks. calls(r): whether rank r
// calls at all; list(r): the ranks it passes; fail(r): its build fails.
template <typename Calls, typename List, typename Fail>
std::vector<Outcome> Run(int n, double timeout_s, Calls calls, List list, Fail fail) {
  InProcessGroup group(n, 1 << 20);
  std::vector<Outcome> out(n);
  group.Run([&](int r) {
    if (!calls(r)) return;
    InProcessRank setup(group, r);
    Outcome& o = out[r];
    o.called = true;
    const auto start = Clock::now();
    o.status = SetUpProcessSet(
        setup, list(r), "", timeout_s,
        [&](std::unique_ptr<Group> g) {
          o.built_size = g->size();
          return fail(r) ? Status::Internal("no shared memory here") : Status::Ok();
        },
        &o.out_of_step);
    o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  });
  return out;
}

void EveryRankAgreesAndMembersBuild() {
  auto out = Run(3, 2.0, [](int) { return true; }, [](int) { return std::vector<int>{0, 2}; },
                 [](int) { return false; });
  for (int r = 0; r < 3; ++r) {
    Expect(out[r].status.ok(), "agreed: rank " + std::to_string(r) + ": " + out[r].status.message());
    Expect(out[r].built_size == (r == 1 ? -1 : 2),
           "agreed: only members build, over a group of 2 (rank " + std::to_string(r) + ")");
    Expect(!out[r].out_of_step, "agreed: in step");
  }
}

void ARankThatNeverCallsIsNamedOnEveryRank() {
  for (int n : {2, 3}) {
    const int skip = n - 1;
    auto out = Run(n, 0.5, [&](int r) { return r != skip; },
                   [&](int) { std::vector<int> all; for (int r = 0; r < n; ++r) all.push_back(r); return all; },
                   [](int) { return false; });
    for (int r = 0; r < skip; ++r) {
      const std::string& m = out[r].status.message();
      const std::string who = std::to_string(n) + " ranks, rank " + std::to_string(skip) +
                              " skips, on rank " + std::to_string(r) + ": ";
      Expect(out[r].status.code() == Status::Code::kInvalidArgument, who + "InvalidArgument: " + m);
      Expect(Contains(m, "rank " + std::to_string(skip) + " did not call add_process_set") &&
                 Contains(m, "add_process_set([0, 1") && Contains(m, "0.5 s"),
             who + "names the missing rank, the set and the timeout: " + m);
      Expect(out[r].seconds < 1.5, who + "within the timeout (" + std::to_string(out[r].seconds) + " s)");
      Expect(out[r].out_of_step, who + "out of step afterwards");
    }
  }
}

void RankZeroMissingIsAnErrorWithinTwiceTheTimeout() {
  auto out = Run(3, 0.5, [](int r) { return r != 0; }, [](int) { return std::vector<int>{0, 1, 2}; },
                 [](int) { return false; });
  for (int r = 1; r < 3; ++r) {
    const std::string& m = out[r].status.message();
    Expect(!out[r].status.ok() && Contains(m, "no verdict from rank 0"),
           "rank 0 missing, on rank " + std::to_string(r) + ": " + m);
    Expect(out[r].seconds < 2.0, "rank 0 missing: within twice the timeout (" +
                                     std::to_string(out[r].seconds) + " s)");
  }
}

void DifferingListsAreRefusedOnEveryRank() {
  auto out = Run(3, 2.0, [](int) { return true; },
                 [](int r) { return r == 1 ? std::vector<int>{0} : std::vector<int>{0, 2}; },
                 [](int) { return false; });
  for (int r = 0; r < 3; ++r) {
    const std::string& m = out[r].status.message();
    Expect(Contains(m, "differ") && Contains(m, "ranks [0, 2] passed [0, 2]") &&
               Contains(m, "rank 1 passed [0]"),
           "differing lists, rank " + std::to_string(r) + ": " + m);
    Expect(!out[r].out_of_step && out[r].built_size == -1,
           "differing lists: nothing built, still in step");
  }
}

void AFailedBuildOnOneRankFailsEveryRank() {
  auto out = Run(3, 2.0, [](int) { return true; }, [](int) { return std::vector<int>{0, 1, 2}; },
                 [](int r) { return r == 1; });
  for (int r = 0; r < 3; ++r) {
    const std::string& m = out[r].status.message();
    Expect(out[r].status.code() == Status::Code::kAborted &&
               Contains(m, "could not be built: no shared memory here"),
           "failed build, rank " + std::to_string(r) + ": " + m);
    Expect(!out[r].out_of_step, "failed build: still in step");
  }
}

// Rank 2 calls only after ranks 0 and 1 gave up on it: it reads rank 0's
// verdict at once instead of waiting.
void ALateCallerGetsTheVerdict() {
  InProcessGroup group(3, 1 << 20);
  std::vector<Outcome> out(3);
  group.Run([&](int r) {
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    InProcessRank setup(group, r);
    const auto start = Clock::now();
    out[r].status = SetUpProcessSet(setup, {0, 1, 2}, "", 0.5,
                                    [](std::unique_ptr<Group>) { return Status::Ok(); },
                                    &out[r].out_of_step);
    out[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
  });
  const std::string& m = out[2].status.message();
  Expect(Contains(m, "rank 2 did not call add_process_set"), "late caller reads the verdict: " + m);
  Expect(out[2].seconds < 0.5, "late caller: at once (" + std::to_string(out[2].seconds) + " s)");
}

}  // namespace

int main() {
  EveryRankAgreesAndMembersBuild();
  ARankThatNeverCallsIsNamedOnEveryRank();
  RankZeroMissingIsAnErrorWithinTwiceTheTimeout();
  DifferingListsAreRefusedOnEveryRank();
  AFailedBuildOnOneRankFailsEveryRank();
  ALateCallerGetsTheVerdict();
  return ddl_test::Summary();
}
