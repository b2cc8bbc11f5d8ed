#include "wait.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <thread>

namespace ddl {

void SharpenNaps() {
  // Linux lets a sleep of a normal thread end up to its timer slack late
  // (50 us by default) so that wake-ups can be merged: a 20 us nap then
  // lasted 70 us or more, and a rank that napped in a wait saw its peer's
  // data that much late, on every small call. A thread that waits for
  // peers asks for naps as long as it asked for instead. Once per thread:
  // the setting is the thread's, and it stays.
  static thread_local const bool sharpened = prctl(PR_SET_TIMERSLACK, kNapSlackNs) == 0;
  (void)sharpened;
}

void Backoff::Pause() {
  const int64_t n = pauses_;
  // Saturates: a wait without a timeout may pause forever.
  if (pauses_ < (int64_t{1} << 62)) ++pauses_;
  if (n < pace_.spin_polls) return;
  if (n < static_cast<int64_t>(pace_.spin_polls) + pace_.yield_polls) {
    sched_yield();
    return;
  }
  SharpenNaps();
  std::this_thread::sleep_for(nap_);
  if (nap_ < pace_.max_nap) nap_ = std::min(nap_ * 2, pace_.max_nap);
}

PipelineIdle::PipelineIdle(double peer_timeout_s) {
  std::chrono::duration<double> after(1.0);
  if (peer_timeout_s > 0) after = std::min(after, std::chrono::duration<double>(peer_timeout_s / 4));
  block_after_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(after);
}

void PipelineIdle::Reset() {
  backoff_.Reset();
  quiet_since_ = std::chrono::steady_clock::now();
}

bool PipelineIdle::Idle() {
  backoff_.Pause();
  // The clock is read only once the polls are over: reading it costs more.
  return !backoff_.Spinning() && std::chrono::steady_clock::now() - quiet_since_ > block_after_;
}

void PeerClock::BeginWait() {
  const auto now = Clock::now();
  if (now - last_ > std::chrono::duration<double>(timeout_s_ / 2)) {
    last_ = now;
    judging_ = false;
  }
}

bool PeerClock::Expired(Clock::time_point now) const {
  if (timeout_s_ <= 0) return false;
  return judging_ ? now >= again_ : now - last_ > std::chrono::duration<double>(timeout_s_);
}

PeerClock::Clock::time_point PeerClock::Deadline(Clock::time_point fallback) const {
  if (timeout_s_ <= 0) return fallback;
  const auto at = judging_ ? again_
                           : last_ + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(timeout_s_));
  return at < fallback ? at : fallback;
}

std::string PeerClock::Judge(const std::string& what, const std::vector<int>& awaited) {
  if (judge_ == nullptr) return "no judge";
  const double quiet = std::chrono::duration<double>(Clock::now() - last_).count();
  const Judgment judgment = judge_->Judge({what, awaited, quiet, !judging_});
  if (!judgment.why.empty()) {
    judging_ = false;
    return judgment.why;
  }
  if (judgment.again_s > 0) {
    judging_ = true;
    again_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(judgment.again_s));
  } else {
    Progress();
  }
  return "";
}

void PeerClock::Throw(const std::string& what, const std::string& why,
                      std::vector<int> unreachable) const {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", timeout_s_);
  std::string message = "no progress for " + std::string(seconds) + " s waiting for " + what;
  if (judge_ != nullptr) message += " (" + why + ")";
  throw PeerTimeout(message, std::move(unreachable));
}

}  // namespace ddl
