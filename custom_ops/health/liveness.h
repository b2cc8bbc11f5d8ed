// Liveness, not impatience: the judge a wait asks when nothing it needs
// has completed for DDL_PEER_TIMEOUT_S (transport/wait.h).
//
// A wait cannot tell on its own a peer that is gone from a message that is
// slow but moving: MPI shows a message only once it completes, and a large
// one sharing a slow link with many others (an allgather round over a
// 10 Mbit/s uplink) takes longer than any timeout that still names a dead
// rank quickly. So the judge asks every rank of the group directly, over
// the fault report's probe channel (fault_report.h), whose answer also
// carries each rank's line of the ActivityBoard below: how far its engine
// has come (collective steps entered), whether it is inside one now, and
// how many bytes its transport has moved. Then:
//
//   1. A rank that is gone, stopped or unreachable ends the wait at once:
//      the fault report names it (within the timeout plus the probe).
//   2. An awaited rank that answers but is behind this collective and not
//      inside any (its engine stuck outside a collective, or without one)
//      ends it too: the stall diagnosis.
//   3. Otherwise the judge notes every rank's moved bytes and asks the wait
//      to call it again after a short window (the wait polls meanwhile: an
//      MPI transfer moves only while its ranks poll). If bytes moved since
//      the first look (this rank's, or any other's), the transfer is slow
//      but moving: the wait goes on with a fresh timeout, and the first
//      time (then at most once a minute) the rank prints one warning line
//      with the rate it saw. If none moved, it looks again, window after
//      window, checking 1 and 2 each time, and ends the wait with "no
//      bytes moved" only once nothing moved for the whole timeout (and at
//      least 4 windows): ranks that outnumber cores (256 thread-ranks on 2
//      cores) can leave every link idle for a window while the transfer is
//      still under way, so one quiet window is no evidence of a hang.
//
// An awaited rank found outside every collective (2) is judged so only
// when two looks a window apart find it at the same step: a rank between
// two steps of its cycle is outside for a moment.
//
// Bytes, not completed messages, because a message in flight completes
// nothing until its last byte; the kernel's counters of the process's TCP
// connections (transport/socket_bytes.h) show each segment. Where a
// transport cannot show bytes (InfiniBand verbs), completed messages are
// the evidence, of at most 4 MiB per peer each.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../transport/group.h"
#include "../transport/wait.h"
#include "fault_report.h"

namespace ddl {

// What one rank's engine of one process set is doing.
struct Activity {
  // Collective steps entered: each cycle is two (its negotiation, then its
  // data transfers), so every rank of the set counts the same steps.
  std::atomic<uint64_t> step{0};
  std::atomic<bool> inside{false};  // inside a step now
};

// Every rank's activity in this process (one rank per process, except on
// the threads-as-ranks harness), as the probe responder reports it.
class ActivityBoard {
 public:
  static ActivityBoard& Get();
  // A context's line, until Remove; `transport` (not owned) gives the
  // moved bytes and must outlive the entry.
  std::shared_ptr<Activity> Add(int world_rank, int set, const Group* transport);
  void Remove(int world_rank, int set);
  // The probe answer (probe_wire.h): the answer byte, the ending line
  // once MarkEnding was called, then a line per entry.
  std::string Describe() const;
  // This process has printed its fault report and ends once the other
  // ranks have printed theirs (or a bound passes): a peer's judge then
  // gives up on its ranks at once, and a peer that ends waits no longer
  // for them.
  void MarkEnding() { ending_ = true; }

 private:
  struct Entry {
    std::shared_ptr<Activity> activity;
    const Group* transport;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<int, int>, Entry> entries_;
  std::atomic<bool> ending_{false};
};

// The judge of one context's waits (all on its engine's cycle thread, or
// on the thread building the context: one at a time).
class ProbeJudge : public Liveness {
 public:
  // `peers`: the context's group; `mine`: this rank's activity in process
  // set `set`; `transport`: its moved bytes; `where`: " (rank R)" for the
  // warning line.
  ProbeJudge(const PeerTable& peers, int set, std::shared_ptr<Activity> mine,
             const Group* transport, double timeout_s, std::string where);

  Judgment Judge(const QuietWait& wait) override;

  // The peers' states as the last judgment that gave up saw them, if it
  // ended less than a few seconds ago (the fault report then says the
  // same without probing again); false otherwise.
  bool RecentStates(std::vector<std::pair<int, PeerState>>* out) const;

  // How long a probe may take: a live process answers in milliseconds, a
  // host behind a cut link never does, so this bounds the report's delay.
  static double Patience(double timeout_s);
  // The time between two looks of a series of judgments.
  static double Window(double timeout_s);
  // How long nothing may move before a wait ends as a hang.
  static double QuietNeeded(double timeout_s);

 private:
  Judgment GiveUp(const std::vector<PeerView>& seen, std::string why);
  void Warn(const QuietWait& wait, double seconds, double own, double others);

  const PeerTable& peers_;
  int set_;
  std::shared_ptr<Activity> mine_;
  const Group* transport_;
  double timeout_s_;
  std::string where_;
  // The first look of the current series: every rank's moved bytes.
  std::vector<PeerView> baseline_;
  uint64_t own_baseline_ = 0;
  std::chrono::steady_clock::time_point baseline_at_{};
  // The awaited ranks the previous look of the series found outside every
  // collective, with their steps.
  std::map<int, uint64_t> outside_before_;
  std::vector<std::pair<int, PeerState>> last_states_;
  std::chrono::steady_clock::time_point gave_up_at_{};
  std::chrono::steady_clock::time_point warned_at_{};
  bool warned_ = false;
};

}  // namespace ddl
