// A POSIX shared-memory segment shared by the ranks of one node: per rank,
// a few staging slots and progress counters that the others can read.
// Waiting on a counter spins briefly, then yields, then sleeps with backoff,
// so ranks that outnumber cores still make progress.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpi_transport.h"

namespace ddl {

class ShmArena {
 public:
  // Progress counters each rank publishes; monotonic over the arena's life.
  enum Counter { kPosted = 0, kReduced = 1, kConsumed = 2, kNumCounters = 3 };

  // Collective over `node` (all its ranks must share memory). `name_token`
  // must be unique to the job and node. Throws TransportError.
  static std::unique_ptr<ShmArena> Create(MpiTransport& node, const std::string& name_token,
                                          size_t slot_bytes, int slots_per_rank);
  ~ShmArena();
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int slots_per_rank() const { return slots_per_rank_; }
  size_t slot_bytes() const { return slot_bytes_; }
  char* Slot(int rank, int slot) const {
    return slots_ + (static_cast<size_t>(rank) * slots_per_rank_ + slot) * slot_bytes_;
  }

  // See MpiTransport::SetPeerTimeout; WaitForAll throws PeerTimeout.
  void SetPeerTimeout(double seconds) { peer_timeout_s_ = seconds; }

  void Publish(Counter counter, uint64_t value);
  // Returns once every rank's `counter` is >= value.
  void WaitForAll(Counter counter, uint64_t value);

 private:
  ShmArena() = default;
  std::atomic<uint64_t>* CounterOf(int rank, Counter counter) const;

  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  double peer_timeout_s_ = 0;
  int slots_per_rank_ = 0;
  size_t slot_bytes_ = 0;
  void* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  char* counters_ = nullptr;
  char* slots_ = nullptr;
};

}  // namespace ddl
