// One POSIX shared-memory segment mapped by every rank of a node. Local
// rank 0 creates and sizes it, the others open it, and the name is removed
// as soon as all have it mapped, so a killed job leaves nothing in /dev/shm.
#pragma once

#include <cstddef>
#include <string>

#include "control_plane.h"
#include "transport.h"

namespace ddl {

// /dev/shm cannot hold a segment that must be committed at set-up. The
// message names /dev/shm, the bytes needed and free, and the fixes.
class ShmTooSmall : public TransportError {
 public:
  using TransportError::TransportError;
};

// Where shm_open puts segments (Linux), and its free and total bytes; both
// 0 when it cannot be read.
constexpr const char* kShmDirectory = "/dev/shm";
void ShmSpace(size_t* free_bytes, size_t* total_bytes);

class NodeSegment {
 public:
  // Collective over `node`. `name_token` must be unique to the job, node and
  // use. `commit`: local rank 0 reserves memory behind every page before
  // any rank maps it, so that touching the segment can never fault; when
  // /dev/shm has no room, every rank of the node throws ShmTooSmall
  // (`purpose` says what the memory is for). Otherwise sparse: pages cost
  // memory once touched, and Commit reserves them as they are used. Throws
  // TransportError, on every rank of the node, if any rank fails.
  NodeSegment(ControlPlane& node, const std::string& name_token, size_t bytes, bool commit,
              const std::string& purpose);
  ~NodeSegment();
  NodeSegment(const NodeSegment&) = delete;
  NodeSegment& operator=(const NodeSegment&) = delete;

  char* base() const { return static_cast<char*>(base_); }
  size_t bytes() const { return bytes_; }

  // Reserves memory behind [offset, offset + bytes) so that touching it
  // cannot fault when /dev/shm is full; false when there is no room.
  bool Commit(size_t offset, size_t bytes);

 private:
  void Unmap();

  void* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

// The error text for a segment of `needed` bytes that /dev/shm could not
// hold on this host (also used when a caller sees it will not fit).
std::string ShmTooSmallMessage(size_t needed, const std::string& purpose);

}  // namespace ddl
