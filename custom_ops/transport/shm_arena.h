// Shared memory of the ranks of one node: per rank, a few staging slots,
// progress counters and a mailbox word that the others can read. The
// whole segment is committed when it is made (NodeSegment), so a full
// /dev/shm is an error at set-up, never a SIGBUS later. Waiting on a
// counter goes at the shared-memory pace of transport/wait.h, so ranks
// that outnumber cores still make progress, with its peer clock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "control_plane.h"
#include "node_segment.h"
#include "transport.h"
#include "wait.h"

namespace ddl {

class ShmArena {
 public:
  // Progress counters each rank publishes; monotonic over the arena's life.
  // kPosted..kConsumed pace the node allreduce's chunks; kAnnounced marks
  // the mailbox words of a call into a shared result as posted.
  enum Counter {
    kPosted = 0,
    kReduced,
    kConsumed,
    kAnnounced,
    kFailureNote,  // how many world ranks this rank lost contact with (PostFailureNote)
    kNumCounters
  };

  // Collective over `node` (all its ranks must share memory). `name_token`
  // must be unique to the job and node. Throws TransportError (on every
  // rank of the node; ShmTooSmall when /dev/shm cannot hold it).
  static std::unique_ptr<ShmArena> Create(ControlPlane& node, const std::string& name_token,
                                          size_t slot_bytes, int slots_per_rank);
  // The bytes Create would ask of /dev/shm for `ranks` ranks.
  static size_t SegmentBytes(int ranks, size_t slot_bytes, int slots_per_rank);
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int slots_per_rank() const { return slots_per_rank_; }
  size_t slot_bytes() const { return slot_bytes_; }
  char* Slot(int rank, int slot) const {
    return slots_ + (static_cast<size_t>(rank) * slots_per_rank_ + slot) * slot_bytes_;
  }

  // See Group::SetPeerTimeout and SetLiveness; WaitForAll throws
  // PeerTimeout. Progress is the awaited rank's counter moving.
  void SetPeerTimeout(double seconds) { clock_.SetTimeout(seconds); }
  void SetLiveness(Liveness* judge) { clock_.SetLiveness(judge); }

  void Publish(Counter counter, uint64_t value);
  // This rank's mailbox word; write it before the Publish that announces
  // it, read the others' after the WaitForAll that follows.
  void Post(uint64_t word);
  uint64_t MailboxOf(int rank) const;
  // Returns once every rank's `counter` is >= value. On a timeout it
  // first gives the awaited rank a moment to post a failure note: a rank
  // of this node stuck on a cut link is not itself the one unreachable.
  // `pace`: how it polls (a wait nobody needs soon may favour the core).
  void WaitForAll(Counter counter, uint64_t value, WaitPace pace = SharedMemoryPace());

  // Tells the node's other ranks which world ranks this one lost contact
  // with (the first kNoteRanks, any world rank), before it ends its process.
  static constexpr int kNoteRanks = 7;
  void PostFailureNote(const std::vector<int>& unreachable);

 private:
  ShmArena() = default;
  // After the judge gave up on `rank` (`why`): the PeerTimeout, naming
  // whom that rank lost if it posts a failure note within a moment.
  [[noreturn]] void ThrowTimeout(int rank, const std::string& why) const;
  // Each rank's counters, one per cache line, then its mailbox line.
  std::atomic<uint64_t>* CounterOf(int rank, int counter) const;

  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  PeerClock clock_;
  int slots_per_rank_ = 0;
  size_t slot_bytes_ = 0;
  std::unique_ptr<NodeSegment> segment_;
  char* counters_ = nullptr;
  char* slots_ = nullptr;
};

}  // namespace ddl
