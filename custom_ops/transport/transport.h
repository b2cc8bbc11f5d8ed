// The point-to-point interface every algorithm is written against. A
// transport is one group of ranks (world, one node, or one cross-node
// column); algorithms see only rank/size and byte messages, never MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/util.h"

namespace ddl {

class Transport {
 public:
  using Handle = int;  // index of an in-flight message, owned by the transport

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Start a message; the buffer must stay untouched until Wait returns.
  virtual Handle Isend(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual Handle Irecv(void* data, size_t bytes, int peer, int tag) = 0;
  // Block (without monopolising the core) until the message completes.
  // Throws TransportError on failure.
  virtual void Wait(Handle handle) = 0;
  // True once the message completed (the handle is then released); never
  // blocks. Throws TransportError on failure.
  virtual bool Test(Handle handle) = 0;

  // The length in bytes of a message from `peer` with `tag` that has
  // arrived and is not yet received, or -1; never blocks. Lets a rank wait
  // with a deadline for a peer that may never send (engine/set_setup.h)
  // without posting a receive that a late message would still complete.
  virtual int64_t Probe(int peer, int tag) = 0;

  // Largest message a single Isend/Irecv accepts; algorithms chunk above it.
  virtual size_t MaxMessageBytes() const = 0;

  // The peer timeout Wait applies (0: none, or not known here). A schedule
  // that polls with Test hands over to Wait well within it (see
  // PipelineIdle in wait.h).
  virtual double PeerTimeoutSeconds() const { return 0; }
};

class TransportError : public std::exception {
 public:
  explicit TransportError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// No progress within the peer timeout; the message names what was awaited.
class PeerTimeout : public TransportError {
 public:
  // `unreachable`: world ranks known to be cut off, when the waiter knows
  // better than "whoever I was waiting for" (see ShmArena::WaitForAll).
  explicit PeerTimeout(std::string message, std::vector<int> unreachable = {})
      : TransportError(std::move(message)), unreachable_(std::move(unreachable)) {}
  const std::vector<int>& unreachable() const { return unreachable_; }

 private:
  std::vector<int> unreachable_;
};

}  // namespace ddl
