// Memory for allreduce results in a node's shared memory: a segment that
// every local rank maps, from which local rank 0 carves one block per fused
// batch. Every local rank's outputs view the same block; each rank holds it
// once, and it returns to the pool when all of them have let go. Handles
// are dropped from any thread, whenever the framework drops the last tensor
// viewing a block; the segment stays mapped until then, even after the
// engine has shut down.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "control_plane.h"
#include "transport.h"
#include "node_segment.h"

namespace ddl {

class ShmPool : public std::enable_shared_from_this<ShmPool> {
 public:
  static constexpr uint64_t kNone = ~uint64_t{0};
  static constexpr size_t kAlignment = 4096;

  // Collective over `node`: `bytes` of address space, committed as used.
  // Throws TransportError.
  static std::shared_ptr<ShmPool> Create(ControlPlane& node, const std::string& name_token,
                                         size_t bytes);

  char* base() const { return segment_->base(); }

  // Local rank 0 only, from one thread: offset of a new block of at least
  // `bytes`, which `holders` handles (one per rank, see Hold) will release;
  // kNone when the pool is full or the machine has no memory behind it.
  uint64_t Allocate(size_t bytes, int holders);
  // This rank's handle on a block: the last copy dropped counts one release.
  std::shared_ptr<void> Hold(uint64_t offset);

 private:
  ShmPool() = default;
  // Gives back the blocks every holder has released.
  void Reclaim();
  void Free(uint64_t start);

  std::unique_ptr<NodeSegment> segment_;
  std::map<uint64_t, size_t> free_;  // start -> bytes, adjacent free blocks merged
  std::map<uint64_t, size_t> used_;  // start -> bytes
  size_t committed_ = 0;             // [0, committed_) has memory behind it
};

}  // namespace ddl
