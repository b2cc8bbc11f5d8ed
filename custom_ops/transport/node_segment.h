// One POSIX shared-memory segment mapped by every rank of a node. Local
// rank 0 creates and sizes it, the others open it, and the name is removed
// as soon as all have it mapped, so a killed job leaves nothing in /dev/shm.
#pragma once

#include <cstddef>
#include <string>

#include "control_plane.h"
#include "transport.h"

namespace ddl {

// n rounded up to a multiple of `to`.

class NodeSegment {
 public:
  // Collective over `node`. `name_token` must be unique to the job, node and
  // use. Sparse: pages cost memory only once touched (see Commit). Throws
  // TransportError, on every rank, if any rank fails.
  NodeSegment(ControlPlane& node, const std::string& name_token, size_t bytes);
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

}  // namespace ddl
