#include "node_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../common/util.h"

namespace ddl {

namespace {
std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string MiB(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
  return text;
}
}  // namespace

void ShmSpace(size_t* free_bytes, size_t* total_bytes) {
  struct statvfs s;
  if (statvfs(kShmDirectory, &s) != 0) {
    *free_bytes = *total_bytes = 0;
    return;
  }
  *free_bytes = static_cast<size_t>(s.f_bavail) * s.f_frsize;
  *total_bytes = static_cast<size_t>(s.f_blocks) * s.f_frsize;
}

std::string ShmTooSmallMessage(size_t needed, const std::string& purpose) {
  size_t free_bytes = 0, total_bytes = 0;
  ShmSpace(&free_bytes, &total_bytes);
  return std::string(kShmDirectory) + " is too small on host " + HostName() + ": " + purpose +
         " needs " + MiB(needed) + " (" + std::to_string(needed) + " bytes) and " +
         kShmDirectory + " has " + MiB(free_bytes) + " free of " + MiB(total_bytes) +
         ". Containers get 64 MiB of /dev/shm unless told otherwise: give more with "
         "`docker run --shm-size=1g` (or `--ipc=host`), or in Kubernetes mount an emptyDir with "
         "`medium: Memory` at /dev/shm; or make keras_ddl's staging area smaller with "
         "DDL_SHM_ARENA_MB (and its results pool with DDL_SHM_POOL_MB), or use no shared memory "
         "with DDL_ALLREDUCE=flat (docs/containers.md)";
}

NodeSegment::NodeSegment(ControlPlane& node, const std::string& name_token, size_t bytes,
                         bool commit, const std::string& purpose)
    : bytes_(bytes) {
  const std::string name = "/keras_ddl." + name_token;
  std::string error;
  bool too_small = false;
  if (node.rank() == 0) {
    shm_unlink(name.c_str());
    fd_ = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd_ < 0) {
      error = Errno("shm_open(" + name + ")");
    } else if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
      error = Errno("ftruncate of shared memory " + name);
    } else if (commit && bytes > 0) {
      // Before anyone maps it: a page of /dev/shm that is not there when
      // first touched is a SIGBUS, in whichever rank touches it first.
      const int code = posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
      if (code == ENOSPC || code == ENOMEM) {
        error = ShmTooSmallMessage(bytes, purpose);
        too_small = true;
      } else if (code != 0) {
        error = "posix_fallocate of shared memory " + name + ": " + std::strerror(code);
      }
    }
  }
  // Rank 0's outcome: "" or, first, '1' for a full /dev/shm, '0' otherwise.
  const std::string outcome = error.empty() ? "" : (too_small ? "1" : "0") + error;
  std::vector<char> status(outcome.begin(), outcome.end());
  node.BroadcastBytes(status, 0);
  if (!status.empty()) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    if (node.rank() == 0) shm_unlink(name.c_str());
    const std::string text(status.begin() + 1, status.end());
    if (status[0] == '1') throw ShmTooSmall(text);
    throw TransportError("cannot create the node's shared memory: " + text);
  }
  if (node.rank() != 0) {
    fd_ = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd_ < 0) error = Errno("shm_open(" + name + ") on a non-zero local rank");
  }
  if (fd_ >= 0) {
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (base == MAP_FAILED) error = Errno("mmap of shared memory");
    else base_ = base;
  }
  // Everyone reports; a failure anywhere fails everyone, with the reason.
  std::vector<int64_t> failed = node.AllgatherInt64(error.empty() ? 0 : 1);
  if (node.rank() == 0) shm_unlink(name.c_str());
  for (size_t r = 0; r < failed.size(); ++r) {
    if (failed[r]) {
      Unmap();
      throw TransportError("shared memory setup failed on local rank " + std::to_string(r) +
                           (error.empty() ? "" : ": " + error));
    }
  }
}

NodeSegment::~NodeSegment() { Unmap(); }

void NodeSegment::Unmap() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

bool NodeSegment::Commit(size_t offset, size_t bytes) {
  return posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0;
}

}  // namespace ddl
