// How every wait of the core waits for another rank, in one place.
//
// Two parts, used together by each wait:
//
// - Backoff, the pace of a polling wait: a few polls (the peer is often
//   about to arrive), then yields of the core (ranks may outnumber cores,
//   and the peer may need this one), then naps doubling up to a cap (over
//   TCP a message's rendezvous needs both ends to poll, so the cap stays
//   short where data moves). Each kind of wait has its WaitPace below.
//
// - PeerClock, the peer timeout (DDL_PEER_TIMEOUT_S): it runs from the
//   wait's last progress, never from its start. When it runs out, the wait
//   does not give up on its own: it asks a Liveness judge, which knows the
//   other ranks (health/liveness.h asks every rank over the fault report's
//   probe channel). The judge may ask to look again after a short window,
//   while the wait goes on polling (an MPI transfer moves only while its
//   ranks poll): a series of judgments that lasts until the wait makes
//   progress, the judge sees bytes move (the clock starts again), or the
//   judge gives up. A transfer that is slow but moving then goes on, and a
//   rank that is gone, stopped, cut off, or stuck while nothing moves ends
//   the wait with PeerTimeout. Without a judge (set-up, before the ranks
//   know each other's probe addresses) the timeout ends the wait.
//
// Why a judge and not a longer timeout: MPI shows a message only once it
// has completed, and a message that shares a slow link with many others
// (an allgather round of every rank's part over a 10 Mbit/s uplink) can
// take longer than any fixed timeout while it moves; the probe channel
// tells a live peer from a dead one directly, and the bytes the ranks'
// connections carried tell a moving transfer from a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport.h"

namespace ddl {

struct WaitPace {
  int spin_polls;   // polls before the first yield
  int yield_polls;  // yields before the first nap
  std::chrono::microseconds first_nap;
  std::chrono::microseconds max_nap;
};

// A wait for a message whose data is needed now. The cap is short because
// over TCP every message's rendezvous needs both ends to poll: with 1 ms
// naps a 2-node reduce-scatter at 1 Gbit/s ran at a third of the link
// rate, with 100 us at the link rate (a nap then costs a few percent of a
// core). The spin is DDL_SPIN_POLLS: 2000 polls, then 2000 yields made a
// 4 KB allreduce of 2 nodes x 2 ranks on 2 cores take 3-4 ms; 50 and 50
// about 1 ms (one rank per core: about the same).
inline WaitPace DataPace(int spin_polls) {
  return {spin_polls, 50, std::chrono::microseconds(20), std::chrono::microseconds(100)};
}
// The engine's idle negotiation: nothing waits for the result, so the wait
// favours CPU, but still polls often (a peer that arrives later needs this
// rank's tests to progress the collective it waits on).
inline WaitPace IdlePace(int spin_polls) {
  return {spin_polls < 10 ? spin_polls : 10, 10, std::chrono::microseconds(20),
          std::chrono::microseconds(200)};
}
// A node's shared memory: peers on other cores usually publish within
// microseconds, and reading a counter costs nothing, so spin longer.
inline WaitPace SharedMemoryPace() {
  return {4000, 200, std::chrono::microseconds(20), std::chrono::microseconds(1000)};
}
// Rare set-up rounds whose waits may last the whole timeout: nap at once.
inline WaitPace SetupPace() {
  return {0, 0, std::chrono::microseconds(1000), std::chrono::microseconds(1000)};
}

// The timer slack (prctl PR_SET_TIMERSLACK) of a thread that naps in a
// wait, set by its first nap (SharpenNaps): a nap lasts what it asks for,
// not up to the default 50 us more.
constexpr unsigned long kNapSlackNs = 1000;
void SharpenNaps();

class Backoff {
 public:
  // `pauses`: how many this wait has made already (0; a check starts one
  // near a limit instead of pausing billions of times).
  explicit Backoff(WaitPace pace, int64_t pauses = 0)
      : pace_(pace), nap_(pace.first_nap), pauses_(pauses) {}
  // One step of the wait: nothing, a yield or a nap, by how long it lasted.
  void Pause();
  // Progress: the next pauses start over with polls.
  void Reset() {
    pauses_ = 0;
    nap_ = pace_.first_nap;
  }
  // True while the pace is still in its polls (a wait checks its clock
  // only every so often then: reading it costs more than a poll).
  bool Spinning() const { return pauses_ < pace_.spin_polls; }
  int64_t pauses() const { return pauses_; }

 private:
  WaitPace pace_;
  std::chrono::microseconds nap_;
  int64_t pauses_ = 0;  // 64 bits: a wait without a timeout may last forever
};

// The wait of a pipelined schedule (the rack and chain allreduces) between
// passes that found nothing done: the data pace, and Idle() once nothing
// moved for a while, when the schedule blocks in the transport's Wait so
// that the peer clock and its judge apply. The while is 1 s (long next to
// a piece's message over a slow uplink: 1 MB at 62 Mbit/s takes 130 ms),
// and a quarter of a shorter peer timeout: Wait starts its clock afresh
// when the quiet before it passed half the timeout (PeerClock::BeginWait),
// so a longer poll would add itself to the time a dead peer takes to be
// named.
class PipelineIdle {
 public:
  explicit PipelineIdle(double peer_timeout_s);
  // Something moved.
  void Reset();
  // One pass found nothing done: pauses, and says whether to block now.
  bool Idle();

 private:
  Backoff backoff_{DataPace(50)};
  std::chrono::steady_clock::duration block_after_;
  std::chrono::steady_clock::time_point quiet_since_ = std::chrono::steady_clock::now();
};

// What a wait tells its judge once the peer timeout has run out.
struct QuietWait {
  std::string what;          // "a message with rank 3", "negotiation allreduce"
  std::vector<int> awaited;  // world ranks it needs, if known
  double quiet_s = 0;        // seconds since its last progress
  // The first judgment since that progress (else the judge asked to look
  // again, and nothing the wait needs has completed since).
  bool first = true;
};

// A judge's answer to one judgment.
struct Judgment {
  std::string why;     // not empty: the wait must end (appended to the PeerTimeout's message)
  double again_s = 0;  // keep waiting; > 0: judge again after this many seconds, 0: the
                       // clock starts again (the transfer moves)
};

class Liveness {
 public:
  virtual ~Liveness() = default;
  // Called on the waiting thread.
  virtual Judgment Judge(const QuietWait& wait) = 0;
};

class PeerClock {
 public:
  using Clock = std::chrono::steady_clock;

  void SetTimeout(double seconds) { timeout_s_ = seconds; }
  double timeout_s() const { return timeout_s_; }
  void SetLiveness(Liveness* judge) { judge_ = judge; }

  // Something the wait needs completed: a series of judgments ends.
  void Progress() {
    last_ = Clock::now();
    judging_ = false;
  }
  // A wait begins: when nothing was in flight for a while, that silence
  // meant nothing, so the clock starts now.
  void BeginWait();
  bool Expired(Clock::time_point now) const;
  // The timeout (or the window the judge asked for) ran out: "" if the
  // judge says keep waiting, else why the wait must end ("no judge"
  // without one).
  std::string Judge(const std::string& what, const std::vector<int>& awaited);
  // The PeerTimeout that ends a wait: "no progress for T s waiting for
  // <what> (<why>)"; `unreachable` becomes its list (see PeerTimeout).
  [[noreturn]] void Throw(const std::string& what, const std::string& why,
                          std::vector<int> unreachable = {}) const;
  // The deadline of a blocking wait (a condition variable's) that wakes
  // to check the clock: when the timeout would run out, else `fallback`.
  Clock::time_point Deadline(Clock::time_point fallback) const;

 private:
  double timeout_s_ = 0;  // 0: wait forever
  Liveness* judge_ = nullptr;
  Clock::time_point last_ = Clock::now();
  // Inside a series of judgments: the next one is due at again_.
  bool judging_ = false;
  Clock::time_point again_{};
};

// Polls `done` (true once the wait is over) at `pace`, with `clock`'s
// timeout; `what` and `awaited` describe the wait to the judge (called
// only on a timeout, so they may be costly). When the judge gives up,
// `give_up(what, why)` must throw.
template <typename Done, typename What, typename Awaited, typename GiveUp>
void WaitFor(Done&& done, WaitPace pace, PeerClock& clock, What&& what, Awaited&& awaited,
             GiveUp&& give_up) {
  Backoff backoff(pace);
  clock.BeginWait();
  while (!done()) {
    // The clock is read every 64 polls while spinning, at every nap after.
    if ((!backoff.Spinning() || (backoff.pauses() & 63) == 0) &&
        clock.Expired(PeerClock::Clock::now())) {
      const std::string described = what();
      const std::string why = clock.Judge(described, awaited());
      if (!why.empty()) give_up(described, why);
      backoff.Reset();
    }
    backoff.Pause();
  }
  clock.Progress();
}

// The same, ending in PeerTimeout when the judge gives up.
template <typename Done, typename What, typename Awaited>
void WaitFor(Done&& done, WaitPace pace, PeerClock& clock, What&& what, Awaited&& awaited) {
  WaitFor(done, pace, clock, what, awaited,
          [&clock](const std::string& described, const std::string& why) {
            clock.Throw(described, why);
          });
}

}  // namespace ddl
