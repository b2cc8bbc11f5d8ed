#include "shm_arena.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace ddl {

namespace {
// Each counter gets its own cache line so one rank's progress never
// invalidates the line another rank is polling.
constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }
}  // namespace

std::unique_ptr<ShmArena> ShmArena::Create(MpiTransport& node, const std::string& name_token,
                                           size_t slot_bytes, int slots_per_rank) {
  std::unique_ptr<ShmArena> arena(new ShmArena());
  arena->rank_ = node.rank();
  arena->size_ = node.size();
  for (int r = 0; r < arena->size_; ++r) arena->world_ranks_.push_back(node.WorldRank(r));
  arena->slots_per_rank_ = slots_per_rank;
  arena->slot_bytes_ = RoundUp(slot_bytes, kPage);
  const size_t counter_bytes =
      RoundUp(static_cast<size_t>(arena->size_) * kNumCounters * kCacheLine, kPage);
  arena->mapped_bytes_ =
      counter_bytes + static_cast<size_t>(arena->size_) * slots_per_rank * arena->slot_bytes_;
  const std::string name = "/keras_ddl." + name_token;

  // Local rank 0 creates and sizes the segment; the others open it after a
  // barrier; once everyone has it mapped the name is unlinked, so nothing
  // is left behind in /dev/shm even if the job is killed later.
  int fd = -1;
  std::string error;
  if (arena->rank_ == 0) {
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) error = Errno("shm_open(" + name + ")");
    else if (ftruncate(fd, static_cast<off_t>(arena->mapped_bytes_)) != 0)
      error = Errno("ftruncate of shared memory " + name);
  }
  std::vector<char> status(error.begin(), error.end());
  node.BroadcastBytes(status, 0);
  if (!status.empty()) {
    if (fd >= 0) close(fd);
    throw TransportError("cannot create the node's shared memory: " +
                         std::string(status.begin(), status.end()));
  }
  if (arena->rank_ != 0) {
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) error = Errno("shm_open(" + name + ") on a non-zero local rank");
  }
  if (fd >= 0) {
    void* base = mmap(nullptr, arena->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) error = Errno("mmap of shared memory");
    else arena->base_ = base;
  }
  // Everyone reports; a failure anywhere fails everyone, with the reason.
  std::vector<int64_t> failed = node.AllgatherInt64(error.empty() ? 0 : 1);
  if (arena->rank_ == 0) shm_unlink(name.c_str());
  for (size_t r = 0; r < failed.size(); ++r) {
    if (failed[r]) {
      throw TransportError("shared memory setup failed on local rank " + std::to_string(r) +
                           (error.empty() ? "" : ": " + error));
    }
  }
  arena->counters_ = static_cast<char*>(arena->base_);
  arena->slots_ = arena->counters_ + counter_bytes;
  return arena;
}

ShmArena::~ShmArena() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
}

std::atomic<uint64_t>* ShmArena::CounterOf(int rank, Counter counter) const {
  // The segment starts zero-filled, which is a valid atomic<uint64_t> of 0.
  return reinterpret_cast<std::atomic<uint64_t>*>(
      counters_ + (static_cast<size_t>(rank) * kNumCounters + counter) * kCacheLine);
}

void ShmArena::Publish(Counter counter, uint64_t value) {
  CounterOf(rank_, counter)->store(value, std::memory_order_release);
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
        throw PeerTimeout("no progress for " + std::to_string(static_cast<int>(peer_timeout_s_)) +
                          " s waiting for rank " + std::to_string(world_ranks_[r]) +
                          " in node shared memory");
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
