#include "shm_pool.h"

#include <algorithm>
#include <atomic>

namespace ddl {

namespace {
// Memory is committed in steps this large, so a growing pool asks the
// kernel rarely.
constexpr size_t kCommitStep = size_t{8} << 20;

// A block is one aligned unit holding the count of ranks still holding it,
// then the data; offsets handed out point at the data.
std::atomic<int64_t>* HoldersOf(char* data) {
  return reinterpret_cast<std::atomic<int64_t>*>(data - ShmPool::kAlignment);
}
}  // namespace

std::shared_ptr<ShmPool> ShmPool::Create(ControlPlane& node, const std::string& name_token,
                                         size_t bytes) {
  std::shared_ptr<ShmPool> pool(new ShmPool());
  bytes = RoundUp(bytes, kAlignment);
  // Sparse: blocks are committed as Allocate hands them out (a full
  // /dev/shm then makes Allocate return kNone: results are copied out).
  pool->segment_ = std::make_unique<NodeSegment>(node, name_token, bytes, false,
                                                 "the results pool (DDL_SHM_POOL_MB)");
  pool->free_[0] = bytes;
  return pool;
}

uint64_t ShmPool::Allocate(size_t bytes, int holders) {
  bytes = kAlignment + RoundUp(std::max<size_t>(bytes, 1), kAlignment);
  Reclaim();
  // First fit from the low end keeps the committed part small.
  auto it = std::find_if(free_.begin(), free_.end(),
                         [bytes](const auto& block) { return block.second >= bytes; });
  if (it == free_.end()) return kNone;
  const uint64_t start = it->first;
  const size_t end = start + bytes;
  if (end > committed_) {
    const size_t target = std::min(segment_->bytes(), RoundUp(end, kCommitStep));
    if (!segment_->Commit(committed_, target - committed_)) return kNone;
    committed_ = target;
  }
  const size_t rest = it->second - bytes;
  free_.erase(it);
  if (rest > 0) free_[end] = rest;
  used_[start] = bytes;
  HoldersOf(base() + start + kAlignment)->store(holders, std::memory_order_relaxed);
  return start + kAlignment;
}

std::shared_ptr<void> ShmPool::Hold(uint64_t offset) {
  std::shared_ptr<ShmPool> self = shared_from_this();
  // Release order: this rank's reads of the block happen before the owner
  // hands it out again. The handle keeps `self`, and so the mapping, alive.
  return std::shared_ptr<void>(base() + offset, [self](void* data) {
    HoldersOf(static_cast<char*>(data))->fetch_sub(1, std::memory_order_release);
  });
}

void ShmPool::Reclaim() {
  for (auto it = used_.begin(); it != used_.end();) {
    const uint64_t start = it->first;
    ++it;
    if (HoldersOf(base() + start + kAlignment)->load(std::memory_order_acquire) == 0) {
      Free(start);
    }
  }
}

void ShmPool::Free(uint64_t start) {
  auto used = used_.find(start);
  size_t bytes = used->second;
  used_.erase(used);
  // Merge with the free neighbours on either side.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = bytes;
}

}  // namespace ddl
