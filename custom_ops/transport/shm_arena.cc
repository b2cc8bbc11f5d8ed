#include "shm_arena.h"

#include <sched.h>

#include <chrono>
#include <thread>

namespace ddl {

namespace {
// Each counter gets its own cache line so one rank's progress never
// invalidates the line another rank is polling.
constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;
}  // namespace

std::unique_ptr<ShmArena> ShmArena::Create(ControlPlane& node, const std::string& name_token,
                                           size_t slot_bytes, int slots_per_rank) {
  std::unique_ptr<ShmArena> arena(new ShmArena());
  arena->rank_ = node.rank();
  arena->size_ = node.size();
  for (int r = 0; r < arena->size_; ++r) arena->world_ranks_.push_back(node.WorldRank(r));
  arena->slots_per_rank_ = slots_per_rank;
  arena->slot_bytes_ = RoundUp(slot_bytes, kPage);
  const size_t counter_bytes =
      RoundUp(static_cast<size_t>(arena->size_) * (kNumCounters + 1) * kCacheLine, kPage);
  arena->segment_ = std::make_unique<NodeSegment>(
      node, name_token,
      counter_bytes + static_cast<size_t>(arena->size_) * slots_per_rank * arena->slot_bytes_);
  arena->counters_ = arena->segment_->base();
  arena->slots_ = arena->counters_ + counter_bytes;
  return arena;
}

std::atomic<uint64_t>* ShmArena::CounterOf(int rank, int counter) const {
  // The segment starts zero-filled, which is a valid atomic<uint64_t> of 0.
  return reinterpret_cast<std::atomic<uint64_t>*>(
      counters_ + (static_cast<size_t>(rank) * (kNumCounters + 1) + counter) * kCacheLine);
}

void ShmArena::Post(uint64_t word) {
  CounterOf(rank_, kNumCounters)->store(word, std::memory_order_relaxed);
}

uint64_t ShmArena::MailboxOf(int rank) const {
  return CounterOf(rank, kNumCounters)->load(std::memory_order_relaxed);
}

void ShmArena::Publish(Counter counter, uint64_t value) {
  CounterOf(rank_, counter)->store(value, std::memory_order_release);
}

void ShmArena::PostFailureNote(const std::vector<int>& unreachable) {
  // Four 16-bit fields of world rank + 1 (0 = empty).
  uint64_t note = 0;
  for (size_t i = 0; i < unreachable.size() && i < 4; ++i) {
    note |= static_cast<uint64_t>((unreachable[i] + 1) & 0xffff) << (16 * i);
  }
  CounterOf(rank_, kFailureNote)->store(note, std::memory_order_release);
}

void ShmArena::ThrowTimeout(int r) const {
  const std::string silence = "no progress for " +
                              std::to_string(static_cast<int>(peer_timeout_s_)) + " s waiting for rank " +
                              std::to_string(world_ranks_[r]) + " in node shared memory";
  // Ranks of a node lose contact with a cut link at about the same time;
  // one that timed out on shared memory waits a little for the note of the
  // rank it waited on, which names the ranks really out of reach.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    const uint64_t note = CounterOf(r, kFailureNote)->load(std::memory_order_acquire);
    if (note != 0) {
      std::vector<int> lost;
      for (int i = 0; i < 4; ++i) {
        const int field = static_cast<int>((note >> (16 * i)) & 0xffff);
        if (field != 0) lost.push_back(field - 1);
      }
      throw PeerTimeout(silence + ", which lost contact with rank(s) [" + RankList(lost) + "]",
                        lost);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw PeerTimeout(silence, {world_ranks_[r]});
}

void ShmArena::WaitForAll(Counter counter, uint64_t value) {
  for (int r = 0; r < size_; ++r) {
    std::atomic<uint64_t>* c = CounterOf(r, counter);
    auto sleep = std::chrono::microseconds(20);
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0; c->load(std::memory_order_acquire) < value; ++polls) {
      if (peer_timeout_s_ > 0 && (polls & 255) == 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
              peer_timeout_s_) {
        ThrowTimeout(r);
      }
      // Peers on other cores usually arrive within microseconds: spin a
      // little; if they do not, they may need this core: yield, then sleep.
      if (polls < 4000) continue;
      if (polls < 4200) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(sleep);
      if (sleep < std::chrono::microseconds(1000)) sleep *= 2;
    }
  }
}

}  // namespace ddl
