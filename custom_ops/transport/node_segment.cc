#include "node_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ddl {

namespace {
std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }
}  // namespace

NodeSegment::NodeSegment(ControlPlane& node, const std::string& name_token, size_t bytes)
    : bytes_(bytes) {
  const std::string name = "/keras_ddl." + name_token;
  std::string error;
  if (node.rank() == 0) {
    shm_unlink(name.c_str());
    fd_ = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd_ < 0) error = Errno("shm_open(" + name + ")");
    else if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
      error = Errno("ftruncate of shared memory " + name);
  }
  std::vector<char> status(error.begin(), error.end());
  node.BroadcastBytes(status, 0);
  if (!status.empty()) {
    if (fd_ >= 0) close(fd_);
    throw TransportError("cannot create the node's shared memory: " +
                         std::string(status.begin(), status.end()));
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
