// The hierarchical allreduce (algorithms/node_allreduce.h) over real POSIX
// shared memory, with threads as ranks: N "nodes" of L local ranks, one
// node plane per node (for the arena's setup) and one cross-node group per
// local rank (tests/core/in_process.h). Several tensors of odd lengths are
// fused into one call with slots of one page, so chunks cut through
// tensors and the slot ring wraps. Checked: every rank gets the same bits,
// and they are the node sums in local-rank order combined in node order
// (then one division for Average). With `small`, the same through the
// single pass (RunSmall: on one node each rank combines the slots, across
// nodes local rank 0 sums the node and exchanges with the other nodes'),
// four calls with the general path second, over a ring of three slots.
// Prints "<N> checks, <F> failures".
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "algorithms/node_allreduce.h"
#include "check.h"
#include "common/reduce_kernels.h"
#include "transport/node_segment.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

float Combine(ReduceOp op, float a, float b) {
  if (op == ReduceOp::kMax) return a < b ? b : a;
  return a + b;
}

// A float32 value in a 16-bit wire dtype and back.
uint16_t ToWire(DataType wire, float x) {
  return wire == DataType::kFloat16 ? FloatToHalf(x) : FloatToBFloat16(x);
}
float FromWire(DataType wire, uint16_t x) {
  return wire == DataType::kFloat16 ? HalfToFloat(x) : BFloat16ToFloat(x);
}

// racks == 0: one switch (the cross step over every node); otherwise
// `nodes` is split into `racks` racks of nodes / racks, rack-major, and the
// cross step is the rack allreduce. `wire` a 16-bit float: the cross step
// sends float16 / bfloat16 (Average only), with inputs near float16's
// largest value: each node's float32 sum is divided by the world size as
// it is converted, then summed in the wire dtype, so every result is
// finite (summing first and dividing after gives inf for float16).
void Check(int nodes, int local, ReduceOp op, int call, int racks = 0,
           DataType wire = DataType::kFloat32, bool small = false) {
  const int world = nodes * local;
  const int per_rack = racks > 0 ? nodes / racks : nodes;
  // With racks a tensor of 300001 and slots of 512 KB as well: slices big
  // enough that the cross step takes the pipelined schedule, not only
  // the one-round exchange.
  std::vector<int64_t> lengths = {1, 1000, 3, 4097, 0, 777};
  if (racks > 0 && !small) lengths.push_back(300001);
  // The single pass takes a whole call in one slot (23.5 KB here).
  const size_t slot_bytes = small ? 64 << 10 : racks > 0 ? 512 << 10 : 4096;
  const int calls = small ? 4 : 1;
  std::mt19937 rng(nodes * 100 + local * 10 + static_cast<int>(op));
  const bool near_max = wire == DataType::kFloat16;
  std::uniform_real_distribution<float> real(near_max ? 40000 : -1, near_max ? 65000 : 1);
  // in[w][t], outs[call][w][t]
  using PerRank = std::vector<std::vector<std::vector<float>>>;
  PerRank in(world);
  std::vector<PerRank> outs(calls, PerRank(world));
  for (int w = 0; w < world; ++w) {
    for (int64_t n : lengths) {
      std::vector<float> v(n);
      for (auto& x : v) x = real(rng);
      in[w].push_back(v);
      for (PerRank& out : outs) out[w].push_back(std::vector<float>(n, std::nanf("")));
    }
  }
  std::vector<std::unique_ptr<InProcessGroup>> node_planes, cross_groups;
  for (int n = 0; n < nodes; ++n) node_planes.push_back(std::make_unique<InProcessGroup>(local, 1 << 20));
  for (int l = 0; l < local; ++l) cross_groups.push_back(std::make_unique<InProcessGroup>(nodes, 1 << 20));
  // [l][rack] and [l][node in rack]: one rack group and one column per
  // local rank, as the cross groups. Messages of 4 KB: several pieces per
  // chunk's slice.
  std::vector<std::vector<std::unique_ptr<InProcessGroup>>> rack_groups(local), columns(local);
  for (int l = 0; racks > 0 && l < local; ++l) {
    for (int r = 0; r < racks; ++r) rack_groups[l].push_back(std::make_unique<InProcessGroup>(per_rack, 4096));
    for (int n = 0; n < per_rack; ++n) columns[l].push_back(std::make_unique<InProcessGroup>(racks, 4096));
  }
  std::vector<TrafficCounters> traffic(world);
  const std::string token = "core-check." + std::to_string(getpid()) + "." + std::to_string(call);

  InProcessGroup everyone(world, 1);
  everyone.Run([&](int w) {
    const int node = w / local, l = w % local;
    InProcessRank plane(*node_planes[node], l);
    InProcessRank cross(*cross_groups[l], node);
    auto arena = ShmArena::Create(plane, token + ".node" + std::to_string(node), slot_bytes, 3);
    arena->SetPeerTimeout(10);
    NodeAllreduce allreduce(*arena, &cross, world, traffic[w]);
    std::unique_ptr<InProcessRank> rack, column;
    if (racks > 0) {
      rack = std::make_unique<InProcessRank>(*rack_groups[l][node / per_rack], node % per_rack);
      column = std::make_unique<InProcessRank>(*columns[l][node % per_rack], node / per_rack);
      allreduce.UseRacks({&cross, rack.get(), column.get()});
    }
    for (int k = 0; k < calls; ++k) {
      std::vector<Span> spans;
      for (size_t t = 0; t < lengths.size(); ++t) {
        spans.push_back({in[w][t].data(), outs[k][w][t].data(), lengths[t]});
      }
      if (small && k != 1) {
        allreduce.RunSmall(spans, DataType::kFloat32, wire, op);
      } else {
        allreduce.Run(spans, DataType::kFloat32, wire, op);
      }
    }
  });

  const std::string label = std::string(small ? "single pass " : "") + (racks > 0 ? std::to_string(racks) + " racks of " : "") +
                            std::to_string(nodes) + "x" + std::to_string(local) + " " +
                            ReduceOpName(op) +
                            (wire != DataType::kFloat32 ? std::string(" over ") + DataTypeName(wire)
                                                        : std::string());
  // Over a 16-bit wire (with more than one node): node values divided and
  // converted, combined in the wire dtype in the same order.
  const bool converted = wire != DataType::kFloat32 && nodes > 1;
  const float scale = 1.0f / static_cast<float>(world);
  for (size_t t = 0; t < lengths.size(); ++t) {
    std::vector<float> want(lengths[t]);
    for (int64_t i = 0; i < lengths[t]; ++i) {
      // Local ranks in order make a node's value; nodes in order a rack's
      // (one switch: a single rack of every node); racks in order the total.
      // A combination over the wire rounds to the wire dtype each time.
      auto across = [&](float a, float b) {
        return converted ? FromWire(wire, ToWire(wire, Combine(op, a, b))) : Combine(op, a, b);
      };
      float total = 0;
      for (int r = 0; r < nodes / per_rack; ++r) {
        float rack_value = 0;
        for (int k = 0; k < per_rack; ++k) {
          const int n = r * per_rack + k;
          float node_value = in[n * local][t][i];
          for (int l = 1; l < local; ++l) node_value = Combine(op, node_value, in[n * local + l][t][i]);
          if (converted) node_value = FromWire(wire, ToWire(wire, node_value * scale));
          rack_value = k == 0 ? node_value : across(rack_value, node_value);
        }
        total = r == 0 ? rack_value : across(total, rack_value);
      }
      want[i] = op == ReduceOp::kAverage && !converted ? total / static_cast<float>(world) : total;
      if (near_max) {
        Expect(std::isfinite(outs[0][0][t][i]), label + " tensor " + std::to_string(t) +
                                                    " element " + std::to_string(i) + " is " +
                                                    std::to_string(outs[0][0][t][i]));
      }
    }
    for (int k = 0; k < calls; ++k) {
      for (int w = 0; w < world; ++w) {
        const std::vector<float>& got = outs[k][w][t];
        const bool same =
            want.empty() || std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
        Expect(same, label + " call " + std::to_string(k) + " tensor " + std::to_string(t) +
                         " on rank " + std::to_string(w) + " is not the node-then-cross order result");
      }
    }
  }
  for (int w = 0; w < world; ++w) {
    Expect((traffic[w].cross_node_bytes > 0) == (nodes > 1),
           label + " rank " + std::to_string(w) + " counts cross-node bytes only across nodes");
  }
}

// A rank's failure note names any world rank whole, up to kNoteRanks of
// them (it was four 16-bit fields: ranks from 65535 up came out wrong).
void FailureNoteNamesLargeRanks(int call) {
  InProcessGroup node(2, 1 << 20);
  node.SetWorldRanks({70000, 70001});
  const std::string token = "core-check." + std::to_string(getpid()) + "." + std::to_string(call);
  std::vector<int> named;
  std::string message;
  node.Run([&](int r) {
    InProcessRank plane(node, r);
    auto arena = ShmArena::Create(plane, token, 4096, 1);
    arena->SetPeerTimeout(0.2);
    if (r == 1) {
      arena->PostFailureNote({65535, 70002, 123456, 4, 5, 6, 7, 8});
    } else {
      // Rank 1 never posts a chunk: the wait times out and reads its note.
      arena->Publish(ShmArena::kPosted, 1);
      try {
        arena->WaitForAll(ShmArena::kPosted, 1);
      } catch (const PeerTimeout& e) {
        named = e.unreachable();
        message = e.what();
      }
    }
    plane.AllgatherInt64(0);  // rank 1's arena lives until rank 0 has read
  });
  const std::vector<int> expected = {65535, 70002, 123456, 4, 5, 6, 7};
  Expect(named == expected, "the note names world ranks >= 65535 whole, the first 7: " + message);
  Expect(message.find("waiting for rank 70001 in node shared memory, which lost contact with "
                      "rank(s) [65535, 70002, 123456, 4, 5, 6, 7]") != std::string::npos,
         "and the timeout's message lists them: " + message);
}

// The arena's memory is reserved in /dev/shm when it is made, not when a
// page is first touched (a full /dev/shm then was a SIGBUS mid-allreduce).
void ArenaIsCommittedAtSetUp(int call) {
  constexpr size_t kSlot = 8 << 20;  // 2 ranks x 4 slots: 64 MiB
  const std::string token = "core-check." + std::to_string(getpid()) + "." + std::to_string(call);
  size_t free_before = 0, free_after = 0, total = 0;
  ShmSpace(&free_before, &total);
  InProcessGroup node(2, 1 << 20);
  node.Run([&](int r) {
    InProcessRank plane(node, r);
    auto arena = ShmArena::Create(plane, token, kSlot, 4);
    plane.AllgatherInt64(0);
    if (r == 0) ShmSpace(&free_after, &total);
    plane.AllgatherInt64(0);
  });
  // Other programs may use /dev/shm meanwhile: most of the 64 MiB suffices.
  Expect(free_before > free_after && free_before - free_after >= (60u << 20),
         "a 64 MiB arena takes its memory from /dev/shm at set-up: " +
             std::to_string(free_before) + " bytes free before, " + std::to_string(free_after) +
             " after");
}

}  // namespace

int main() {
  int call = 0;
  for (int nodes : {1, 2, 3}) {
    for (int local : {1, 2, 3}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        Check(nodes, local, op, call++);
      }
    }
  }
  // 1-3 racks x 1-3 nodes x 1-2 local ranks through the rack allreduce.
  for (int racks : {1, 2, 3}) {
    for (int per_rack : {1, 2, 3}) {
      for (int local : {1, 2}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
          Check(racks * per_rack, local, op, call++, racks);
        }
      }
    }
  }
  // Average over a 16-bit wire: divided before the cross-node sum (float16
  // inputs near 65504 stay finite), one switch and racks.
  for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
    for (int nodes : {1, 2, 3}) {
      for (int local : {1, 2, 3}) Check(nodes, local, ReduceOp::kAverage, call++, 0, wire);
    }
    Check(4, 2, ReduceOp::kAverage, call++, 2, wire);
    Check(3, 1, ReduceOp::kAverage, call++, 3, wire);
  }
  // The single pass: 1-3 nodes x 1-3 local ranks (3 nodes: not a power
  // of two), Sum / Average / Max; racks; Average over 16-bit wires.
  for (int nodes : {1, 2, 3}) {
    for (int local : {1, 2, 3}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        Check(nodes, local, op, call++, 0, DataType::kFloat32, true);
      }
    }
  }
  Check(4, 2, ReduceOp::kSum, call++, 2, DataType::kFloat32, true);
  Check(3, 2, ReduceOp::kMax, call++, 3, DataType::kFloat32, true);
  for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
    Check(3, 2, ReduceOp::kAverage, call++, 0, wire, true);
    Check(4, 2, ReduceOp::kAverage, call++, 2, wire, true);
  }
  FailureNoteNamesLargeRanks(call++);
  ArenaIsCommittedAtSetUp(call++);
  return ddl_test::Summary();
}
