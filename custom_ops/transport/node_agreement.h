// A ControlPlane whose bitwise AND goes through the node's shared memory
// when every rank of the plane is on this node: the negotiation's steady
// cycle (one AND of a few words) then costs a store, a release and a poll
// of each peer's counter, not an MPI round trip. Every other operation
// (the by-name exchange, gathers, broadcasts) goes to the inner plane.
//
// The round: each rank writes its words into its slot of the round's
// parity, publishes the round number, waits until every rank has published
// it, and ANDs every rank's slot. Two slots per rank suffice: a rank writes
// round k+2 only after it has seen every rank publish round k+1, which each
// did after reading round k.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "control_plane.h"
#include "shm_arena.h"

namespace ddl {

class NodeAgreement : public ControlPlane {
 public:
  // Collective over `node`, which must hold exactly the ranks of `inner`,
  // in the same order, on one machine. `max_words`: the longest AND that
  // goes through shared memory (longer ones go to `inner`, on every rank
  // alike since the ranks AND vectors of one length). `name_token` is
  // unique to the job and node. Throws TransportError on every rank of the
  // node when the segment cannot be made.
  NodeAgreement(ControlPlane& inner, ControlPlane& node, const std::string& name_token,
                size_t max_words);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int WorldRank(int r) const override { return inner_.WorldRank(r); }

  void AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool idle) override;
  std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine, int root) override {
    return inner_.GatherBytes(mine, root);
  }
  void BroadcastBytes(std::vector<char>& data, int root) override {
    inner_.BroadcastBytes(data, root);
  }
  std::vector<int64_t> AllgatherInt64(int64_t mine) override {
    return inner_.AllgatherInt64(mine);
  }

  // The shared memory's waits: the peer timeout and its judge, and the
  // failure note a rank leaves before it ends (see ShmArena).
  ShmArena& memory() { return *arena_; }
  // Rounds that went through shared memory (for the checks).
  uint64_t rounds() const { return round_; }

 private:
  ControlPlane& inner_;
  std::unique_ptr<ShmArena> arena_;
  size_t max_words_;
  uint64_t round_ = 0;
};

}  // namespace ddl
