// A ControlPlane that counts the group operations passing through it and
// forwards them to another plane (the harness's): what a negotiation cycle
// costs, and which of its steps went over the inner plane.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/control_plane.h"

namespace ddl_test {

using ddl::ControlPlane;

struct Counts {
  int and_ops = 0;
  size_t and_bytes = 0;  // this rank's contribution
  int gathers = 0;
  size_t gathered_at_root = 0;  // what rank 0 received, all ranks together
  int broadcasts = 0;
  size_t broadcast_bytes = 0;
};

// A ControlPlane that counts what passes through it and forwards to the
// harness's.
class CountingPlane : public ddl::ControlPlane {
 public:
  explicit CountingPlane(ControlPlane& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int WorldRank(int r) const override { return inner_.WorldRank(r); }
  void AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool idle) override {
    ++counts.and_ops;
    counts.and_bytes += words.size() * sizeof(uint64_t);
    inner_.AllreduceBitwiseAnd(words, idle);
  }
  std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine, int root) override {
    ++counts.gathers;
    auto all = inner_.GatherBytes(mine, root);
    for (const auto& part : all) counts.gathered_at_root += part.size();
    return all;
  }
  void BroadcastBytes(std::vector<char>& data, int root) override {
    ++counts.broadcasts;
    inner_.BroadcastBytes(data, root);
    counts.broadcast_bytes += data.size();
  }
  std::vector<int64_t> AllgatherInt64(int64_t mine) override {
    return inner_.AllgatherInt64(mine);
  }
  Counts counts;

 private:
  ControlPlane& inner_;
};

}  // namespace ddl_test
