// The group operations that are not data movement: the engine's
// negotiation (over the world) and the setup of a node's shared memory
// (over the ranks of one node). Every rank of the group makes the same
// calls in the same order. MpiTransport implements it over a communicator;
// tests implement it with threads as ranks, so negotiation and node setup
// run without MPI.
#pragma once

#include <cstdint>
#include <vector>

namespace ddl {

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank in the whole job of this group's rank `r` (for error messages).
  virtual int WorldRank(int r) const = 0;

  // Element-wise AND of every rank's words, in place. `idle`: nothing is
  // waiting on the result, so the wait may favour CPU over latency.
  virtual void AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool idle) = 0;
  // Root receives every rank's bytes, indexed by rank; others get nothing.
  virtual std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine,
                                                     int root) = 0;
  // Every rank ends with root's bytes (any length).
  virtual void BroadcastBytes(std::vector<char>& data, int root) = 0;
  virtual std::vector<int64_t> AllgatherInt64(int64_t mine) = 0;
};

}  // namespace ddl
