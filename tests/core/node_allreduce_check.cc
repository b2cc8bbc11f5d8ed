// The hierarchical allreduce (algorithms/node_allreduce.h) over real POSIX
// shared memory, with threads as ranks: N "nodes" of L local ranks, one
// node plane per node (for the arena's setup) and one cross-node group per
// local rank (tests/core/in_process.h). Several tensors of odd lengths are
// fused into one call with slots of one page, so chunks cut through
// tensors and the slot ring wraps. Checked: every rank gets the same bits,
// and they are the node sums in local-rank order combined in node order
// (then one division for Average). Prints "<N> checks, <F> failures".
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "algorithms/node_allreduce.h"
#include "check.h"
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

void Check(int nodes, int local, ReduceOp op, int call) {
  const int world = nodes * local;
  const std::vector<int64_t> lengths = {1, 1000, 3, 4097, 0, 777};
  std::mt19937 rng(nodes * 100 + local * 10 + static_cast<int>(op));
  std::uniform_real_distribution<float> real(-1, 1);
  // inputs[w][t]
  std::vector<std::vector<std::vector<float>>> in(world), out(world);
  for (int w = 0; w < world; ++w) {
    for (int64_t n : lengths) {
      std::vector<float> v(n);
      for (auto& x : v) x = real(rng);
      in[w].push_back(v);
      out[w].push_back(std::vector<float>(n, std::nanf("")));
    }
  }
  std::vector<std::unique_ptr<InProcessGroup>> node_planes, cross_groups;
  for (int n = 0; n < nodes; ++n) node_planes.push_back(std::make_unique<InProcessGroup>(local, 1 << 20));
  for (int l = 0; l < local; ++l) cross_groups.push_back(std::make_unique<InProcessGroup>(nodes, 1 << 20));
  std::vector<TrafficCounters> traffic(world);
  const std::string token = "core-check." + std::to_string(getpid()) + "." + std::to_string(call);

  InProcessGroup everyone(world, 1);
  everyone.Run([&](int w) {
    const int node = w / local, l = w % local;
    InProcessRank plane(*node_planes[node], l);
    InProcessRank cross(*cross_groups[l], node);
    auto arena = ShmArena::Create(plane, token + ".node" + std::to_string(node), 4096, 3);
    arena->SetPeerTimeout(10);
    NodeAllreduce allreduce(*arena, &cross, world, traffic[w]);
    std::vector<Span> spans;
    for (size_t t = 0; t < lengths.size(); ++t) {
      spans.push_back({in[w][t].data(), out[w][t].data(), lengths[t]});
    }
    allreduce.Run(spans, DataType::kFloat32, DataType::kFloat32, op);
  });

  const std::string label = std::to_string(nodes) + "x" + std::to_string(local) + " " +
                            ReduceOpName(op);
  for (size_t t = 0; t < lengths.size(); ++t) {
    std::vector<float> want(lengths[t]);
    for (int64_t i = 0; i < lengths[t]; ++i) {
      float total = 0;
      for (int n = 0; n < nodes; ++n) {
        float node_value = in[n * local][t][i];
        for (int l = 1; l < local; ++l) node_value = Combine(op, node_value, in[n * local + l][t][i]);
        total = n == 0 ? node_value : Combine(op, total, node_value);
      }
      want[i] = op == ReduceOp::kAverage ? total / static_cast<float>(world) : total;
    }
    for (int w = 0; w < world; ++w) {
      const bool same = want.empty() ||
                        std::memcmp(want.data(), out[w][t].data(), want.size() * sizeof(float)) == 0;
      Expect(same, label + " tensor " + std::to_string(t) + " on rank " + std::to_string(w) +
                       " is not the node-then-cross order result");
    }
  }
  for (int w = 0; w < world; ++w) {
    Expect((traffic[w].cross_node_bytes > 0) == (nodes > 1),
           label + " rank " + std::to_string(w) + " counts cross-node bytes only across nodes");
  }
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
  return ddl_test::Summary();
}
