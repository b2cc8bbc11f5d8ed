#include "liveness.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "../common/util.h"

namespace ddl {

namespace {

// How long a judgment that gave up stays fresh for the fault report.
constexpr std::chrono::seconds kStatesFresh{5};
// The warning of a slow transfer: the first, then at most one this often.
constexpr std::chrono::seconds kWarnEvery{60};

std::string Bytes(double bytes) {
  char text[32];
  if (bytes >= 1e6) {
    std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.0f KB", bytes / 1e3);
  }
  return text;
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

const PeerView* Find(const std::vector<PeerView>& views, int world_rank) {
  for (const PeerView& v : views) {
    if (v.world_rank == world_rank) return &v;
  }
  return nullptr;
}

std::vector<int> NotAlive(const std::vector<PeerView>& views) {
  std::vector<int> ranks;
  for (const PeerView& v : views) {
    if (v.state != PeerState::kAlive) ranks.push_back(v.world_rank);
  }
  return ranks;
}

}  // namespace

ActivityBoard& ActivityBoard::Get() {
  static ActivityBoard* board = new ActivityBoard();  // the responder reads it until exit
  return *board;
}

std::shared_ptr<Activity> ActivityBoard::Add(int world_rank, int set, const Group* transport) {
  auto activity = std::make_shared<Activity>();
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[{world_rank, set}] = {activity, transport};
  return activity;
}

void ActivityBoard::Remove(int world_rank, int set) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.erase({world_rank, set});
}

std::string ActivityBoard::Describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text = ending_ ? std::string(kEndingLine) + "\n" : "";
  for (const auto& [key, entry] : entries_) {
    text += "A " + std::to_string(key.first) + " " + std::to_string(key.second) + " " +
            std::to_string(entry.activity->step.load()) + " " +
            (entry.activity->inside.load() ? "1" : "0") + " " +
            std::to_string(entry.transport ? entry.transport->MovedBytes() : 0) + "\n";
  }
  return text;
}

ProbeJudge::ProbeJudge(const PeerTable& peers, int set, std::shared_ptr<Activity> mine,
                       const Group* transport, double timeout_s, std::string where)
    : peers_(peers), set_(set), mine_(std::move(mine)), transport_(transport),
      timeout_s_(timeout_s), where_(std::move(where)) {}

double ProbeJudge::Patience(double timeout_s) {
  return std::min(3.0, std::max(1.0, timeout_s / 5));
}

std::string ProbeJudge::GiveUp(const std::vector<PeerView>& seen, std::string why) {
  last_states_.clear();
  for (const PeerView& v : seen) last_states_.emplace_back(v.world_rank, v.state);
  gave_up_at_ = std::chrono::steady_clock::now();
  return why;
}

bool ProbeJudge::RecentStates(std::vector<std::pair<int, PeerState>>* out) const {
  if (last_states_.empty() || std::chrono::steady_clock::now() - gave_up_at_ > kStatesFresh) {
    return false;
  }
  *out = last_states_;
  return true;
}

std::string ProbeJudge::Judge(const QuietWait& wait) {
  const double patience = Patience(timeout_s_);
  const uint64_t own_before = transport_->MovedBytes();
  const std::vector<PeerView> first = peers_.Survey(patience, set_);
  // 1. A peer gone, stopped or cut off: the fault report names it.
  std::vector<int> lost = NotAlive(first);
  if (!lost.empty()) return GiveUp(first, "rank(s) [" + RankList(lost) + "] do not answer");
  // 1b. A peer that reported a fault of its own and ends: it will not
  // take part in this collective again.
  std::vector<int> ending;
  for (const PeerView& v : first) {
    if (v.ending) ending.push_back(v.world_rank);
  }
  if (!ending.empty()) {
    return GiveUp(first, "rank(s) [" + RankList(ending) + "] reported a fault and end");
  }
  // 2. An awaited peer behind this collective and inside none: a hang.
  const uint64_t step = mine_->step.load();
  std::vector<int> outside;
  for (int a : wait.awaited) {
    const PeerView* v = Find(first, a);
    if (v != nullptr && (!v->known || (v->step < step && !v->inside))) outside.push_back(a);
  }
  if (!outside.empty()) {
    return GiveUp(first, "rank(s) [" + RankList(outside) +
                             "] answer but are inside no collective, behind this one");
  }
  // 3. Everyone answers and is in step: do bytes move anywhere?
  const double window = std::clamp(timeout_s_ / 4, 0.05, 1.0);
  std::this_thread::sleep_for(std::chrono::duration<double>(window));
  const std::vector<PeerView> second = peers_.Survey(patience, set_);
  const uint64_t own_after = transport_->MovedBytes();
  lost = NotAlive(second);
  if (!lost.empty()) return GiveUp(second, "rank(s) [" + RankList(lost) + "] do not answer");
  const double own = own_after > own_before ? static_cast<double>(own_after - own_before) : 0;
  double others = 0;
  for (const PeerView& after : second) {
    const PeerView* before = Find(first, after.world_rank);
    if (before != nullptr && after.known && before->known && after.moved > before->moved) {
      others += static_cast<double>(after.moved - before->moved);
    }
  }
  if (own + others == 0) {
    return GiveUp(second, "every rank answers, but no rank's transfers moved a byte in " +
                              Seconds(window) + " s: a collective hangs");
  }
  const auto now = std::chrono::steady_clock::now();
  if (!warned_ || now - warned_at_ > kWarnEvery) {
    warned_ = true;
    warned_at_ = now;
    std::fprintf(stderr,
                 "[keras_ddl] warning: slow transfer: nothing completed for %s s waiting for %s, "
                 "but it is moving: every rank answers a probe, and in %s s this rank's transfers "
                 "moved %s (%s/s) and the other ranks' %s. keras_ddl keeps waiting: "
                 "DDL_PEER_TIMEOUT_S ends a wait only when a rank is gone, stopped or cut off, "
                 "or nothing moves (this warning is repeated at most once a minute)%s\n",
                 Seconds(wait.quiet_s < 1 ? wait.quiet_s : static_cast<int>(wait.quiet_s)).c_str(),
                 wait.what.c_str(), Seconds(window).c_str(), Bytes(own).c_str(),
                 Bytes(own / window).c_str(), Bytes(others).c_str(), where_.c_str());
    std::fflush(stderr);
  }
  return "";
}

}  // namespace ddl
