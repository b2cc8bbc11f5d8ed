#include "shm_arena.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace ddl {

namespace {
// Each counter gets its own cache line so one rank's progress never
// invalidates the line another rank is polling.
constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}
}  // namespace

size_t ShmArena::SegmentBytes(int ranks, size_t slot_bytes, int slots_per_rank) {
  const size_t counter_bytes =
      RoundUp(static_cast<size_t>(ranks) * (kNumCounters + 1) * kCacheLine, kPage);
  return counter_bytes + static_cast<size_t>(ranks) * slots_per_rank * RoundUp(slot_bytes, kPage);
}

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
  // Committed: every allreduce touches all of it sooner or later.
  arena->segment_ = std::make_unique<NodeSegment>(
      node, name_token, SegmentBytes(arena->size_, slot_bytes, slots_per_rank), true,
      "the staging area of the node's " + std::to_string(arena->size_) + " ranks (" +
          std::to_string(slots_per_rank) + " slots of " + std::to_string(arena->slot_bytes_ >> 10) +
          " KiB each)");
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
  // The note's cache line: word 0 the count (published last), words 1-7
  // the world ranks, whole, so any rank of any job fits.
  std::atomic<uint64_t>* note = CounterOf(rank_, kFailureNote);
  const int n = static_cast<int>(std::min<size_t>(unreachable.size(), kNoteRanks));
  for (int i = 0; i < n; ++i) {
    note[1 + i].store(static_cast<uint64_t>(unreachable[i]), std::memory_order_relaxed);
  }
  note->store(static_cast<uint64_t>(n) + 1, std::memory_order_release);  // 0: no note
}

void ShmArena::ThrowTimeout(int r, const std::string& why) const {
  const std::string silence = "no progress for " + Seconds(clock_.timeout_s()) +
                              " s waiting for rank " + std::to_string(world_ranks_[r]) +
                              " in node shared memory" + (why == "no judge" ? "" : " (" + why + ")");
  // Ranks of a node lose contact with a cut link at about the same time;
  // one that timed out on shared memory waits a little for the note of the
  // rank it waited on, which names the ranks really out of reach.
  std::atomic<uint64_t>* note = CounterOf(r, kFailureNote);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  Backoff backoff(SetupPace());
  while (std::chrono::steady_clock::now() < until) {
    const uint64_t count = note->load(std::memory_order_acquire);
    if (count != 0) {
      std::vector<int> lost;
      for (uint64_t i = 0; i + 1 < count && i < kNoteRanks; ++i) {
        lost.push_back(static_cast<int>(note[1 + i].load(std::memory_order_relaxed)));
      }
      throw PeerTimeout(silence + ", which lost contact with rank(s) [" + RankList(lost) + "]",
                        lost);
    }
    backoff.Pause();
  }
  throw PeerTimeout(silence, {world_ranks_[r]});
}

void ShmArena::WaitForAll(Counter counter, uint64_t value, WaitPace pace) {
  for (int r = 0; r < size_; ++r) {
    std::atomic<uint64_t>* c = CounterOf(r, counter);
    uint64_t seen = c->load(std::memory_order_acquire);
    if (seen >= value) continue;
    // Progress is rank r's counter moving (a chunk of a long call), so a
    // long call with a slow cross-node step is judged chunk by chunk.
    auto done = [&] {
      const uint64_t now = c->load(std::memory_order_acquire);
      if (now != seen) {
        seen = now;
        clock_.Progress();
      }
      return now >= value;
    };
    // When the judge gives up on rank r, its failure note, if it posts
    // one, names whom it lost.
    WaitFor(done, pace, clock_,
            [&] { return "rank " + std::to_string(world_ranks_[r]) + " in node shared memory"; },
            [&] { return std::vector<int>{world_ranks_[r]}; },
            [&](const std::string&, const std::string& why) { ThrowTimeout(r, why); });
  }
}

}  // namespace ddl
