#include "liveness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
  ProbeAnswer answer;
  answer.ending = ending_;
  for (const auto& [key, entry] : entries_) {
    ActivityLine line;
    line.world_rank = key.first;
    line.set = key.second;
    line.step = entry.activity->step.load();
    line.inside = entry.activity->inside.load();
    line.moved = entry.transport ? entry.transport->MovedBytes() : 0;
    answer.lines.push_back(line);
  }
  return EncodeProbeAnswer(answer);
}

ProbeJudge::ProbeJudge(const PeerTable& peers, int set, std::shared_ptr<Activity> mine,
                       const Group* transport, double timeout_s, std::string where)
    : peers_(peers), set_(set), mine_(std::move(mine)), transport_(transport),
      timeout_s_(timeout_s), where_(std::move(where)) {}

double ProbeJudge::Patience(double timeout_s) {
  return std::min(3.0, std::max(1.0, timeout_s / 5));
}

double ProbeJudge::Window(double timeout_s) { return std::clamp(timeout_s / 4, 0.05, 1.0); }

double ProbeJudge::QuietNeeded(double timeout_s) {
  return std::max(timeout_s, 4 * Window(timeout_s));
}

Judgment ProbeJudge::GiveUp(const std::vector<PeerView>& seen, std::string why) {
  last_states_.clear();
  for (const PeerView& v : seen) last_states_.emplace_back(v.world_rank, v.state);
  gave_up_at_ = std::chrono::steady_clock::now();
  return {std::move(why), 0};
}

bool ProbeJudge::RecentStates(std::vector<std::pair<int, PeerState>>* out) const {
  if (last_states_.empty() || std::chrono::steady_clock::now() - gave_up_at_ > kStatesFresh) {
    return false;
  }
  *out = last_states_;
  return true;
}

Judgment ProbeJudge::Judge(const QuietWait& wait) {
  const double patience = Patience(timeout_s_);
  const uint64_t own = transport_->MovedBytes();
  const std::vector<PeerView> seen = peers_.Survey(patience, set_);
  const auto now = std::chrono::steady_clock::now();
  // 1. A peer gone, stopped or cut off: the fault report names it.
  std::vector<int> lost = NotAlive(seen);
  if (!lost.empty()) return GiveUp(seen, "rank(s) [" + RankList(lost) + "] do not answer");
  // 1b. A peer that reported a fault of its own and ends: it will not
  // take part in this collective again.
  std::vector<int> ending;
  for (const PeerView& v : seen) {
    if (v.ending) ending.push_back(v.world_rank);
  }
  if (!ending.empty()) {
    return GiveUp(seen, "rank(s) [" + RankList(ending) + "] reported a fault and end");
  }
  if (wait.first) outside_before_.clear();
  // 2. An awaited peer behind this collective and inside none, at the same
  // step as a window ago: a hang.
  const uint64_t step = mine_->step.load();
  std::map<int, uint64_t> outside_now;
  std::vector<int> outside;
  for (int a : wait.awaited) {
    const PeerView* v = Find(seen, a);
    if (v == nullptr || (v->known && (v->step >= step || v->inside))) continue;
    const uint64_t at = v->known ? v->step : ~uint64_t{0};
    outside_now[a] = at;
    auto before = outside_before_.find(a);
    if (before != outside_before_.end() && before->second == at) outside.push_back(a);
  }
  outside_before_ = std::move(outside_now);
  if (!outside.empty()) {
    return GiveUp(seen, "rank(s) [" + RankList(outside) +
                            "] answer but are inside no collective, behind this one");
  }
  // 3. Everyone answers and is in step: do bytes move anywhere? The first
  // look notes the bytes; later ones compare.
  const double window = Window(timeout_s_);
  if (wait.first) {
    baseline_ = seen;
    own_baseline_ = own;
    baseline_at_ = now;
    return {"", window};
  }
  const double own_moved = own > own_baseline_ ? static_cast<double>(own - own_baseline_) : 0;
  double others = 0;
  for (const PeerView& after : seen) {
    const PeerView* before = Find(baseline_, after.world_rank);
    if (before != nullptr && after.known && before->known && after.moved > before->moved) {
      others += static_cast<double>(after.moved - before->moved);
    }
  }
  const double observed = std::chrono::duration<double>(now - baseline_at_).count();
  if (own_moved + others == 0) {
    if (observed < QuietNeeded(timeout_s_)) return {"", window};
    return GiveUp(seen, "every rank answers, but no rank's transfers moved a byte in " +
                            Seconds(std::round(observed * 100) / 100) +
                            " s: a collective hangs");
  }
  Warn(wait, observed, own_moved, others);
  return {"", 0};
}

void ProbeJudge::Warn(const QuietWait& wait, double seconds, double own, double others) {
  const auto now = std::chrono::steady_clock::now();
  if (warned_ && now - warned_at_ <= kWarnEvery) return;
  warned_ = true;
  warned_at_ = now;
  const double quiet = wait.quiet_s;
  std::fprintf(stderr,
               "[keras_ddl] warning: slow transfer: nothing completed for %s s waiting for %s, "
               "but it is moving: every rank answers a probe, and in %s s this rank's transfers "
               "moved %s (%s/s) and the other ranks' %s. keras_ddl keeps waiting: "
               "DDL_PEER_TIMEOUT_S ends a wait only when a rank is gone, stopped or cut off, "
               "or nothing moves (this warning is repeated at most once a minute)%s\n",
               Seconds(quiet < 1 ? std::round(quiet * 100) / 100 : static_cast<int>(quiet)).c_str(),
               wait.what.c_str(), Seconds(std::round(seconds * 100) / 100).c_str(),
               Bytes(own).c_str(), Bytes(own / std::max(seconds, 1e-3)).c_str(),
               Bytes(others).c_str(), where_.c_str());
  std::fflush(stderr);
}

}  // namespace ddl
