// What a negotiation cycle costs as the job grows (issue #27, item 5), on
// threads as ranks (tests/core/in_process.h): every rank runs its own
// Controller through the same cycles, offering 1 or 200 tensors per cycle,
// either the same names every cycle (cached: after the first cycle they
// cost one bit each) or new names every cycle (uncached: by name to the
// coordinator). A counting control plane records, per cycle, the group
// operations each rank makes and the bytes they carry.
//
// What the counts mean on MPI: a cycle whose only operation is the bitwise
// AND is one MPI_Allreduce of W words, ceil(log2 n) rounds of W words
// (recursive doubling); the by-name exchange adds a gather to rank 0 (its
// bytes grow with n x tensors) and a broadcast (log2 n rounds).
//
// Usage: negotiation_cost [--check] [ranks...]
//   prints one table row per (ranks, tensors, cached/uncached), with the
//   harness's wall time per cycle (every rank a thread on this machine's
//   cores: it measures total CPU work, not network latency);
//   --check: prints "<N> checks, <F> failures" for tests/core/test_core.py
//   (exact operation counts, no timing).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "negotiation/controller.h"
#include "counting_plane.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Counts;
using ddl_test::CountingPlane;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

Request Make(const std::string& name, int rank) {
  Request r;
  r.name = name;
  r.rank = rank;
  r.dtype = r.wire = DataType::kFloat32;
  r.op = ReduceOp::kSum;
  r.shape = {1024, 64};
  return r;
}

struct Row {
  int ranks, tensors;
  bool cached;
  Counts per_cycle;    // rank 0's counts over the measured cycles / cycles
  double us_per_cycle; // harness wall time
  bool all_ran;        // every offered tensor ran, on every rank
};

Row Measure(int n, int tensors, bool cached, int warm, int cycles) {
  InProcessGroup group(n, 1 << 20);
  std::vector<Counts> at_start(n), at_end(n);
  std::vector<int> ran(n, 0);
  std::chrono::steady_clock::time_point start, end;
  Config config;
  group.Run([&](int r) {
    InProcessRank rank(group, r);
    CountingPlane plane(rank);
    Controller controller(plane, config);
    for (int c = 0; c < warm + cycles; ++c) {
      if (c == warm) {
        at_start[r] = plane.counts;
        if (r == 0) start = std::chrono::steady_clock::now();
      }
      for (int t = 0; t < tensors; ++t) {
        const std::string name =
            cached ? "grad." + std::to_string(t) : "c" + std::to_string(c) + ".t" + std::to_string(t);
        controller.Offer(Make(name, r));
      }
      // Every rank offered all of this cycle's names, so each cycle runs
      // them all: one cycle per step, as the engine's steady state.
      Negotiated out = controller.Negotiate(false);
      if (c >= warm) ran[r] += static_cast<int>(out.run.size());
    }
    at_end[r] = plane.counts;
    if (r == 0) end = std::chrono::steady_clock::now();
  });
  Row row{n, tensors, cached, {}, 0, true};
  const Counts& a = at_start[0];
  const Counts& b = at_end[0];
  row.per_cycle.and_ops = (b.and_ops - a.and_ops) / cycles;
  row.per_cycle.and_bytes = (b.and_bytes - a.and_bytes) / cycles;
  row.per_cycle.gathers = (b.gathers - a.gathers) / cycles;
  row.per_cycle.gathered_at_root = (b.gathered_at_root - a.gathered_at_root) / cycles;
  row.per_cycle.broadcasts = (b.broadcasts - a.broadcasts) / cycles;
  row.per_cycle.broadcast_bytes = (b.broadcast_bytes - a.broadcast_bytes) / cycles;
  row.us_per_cycle = std::chrono::duration<double, std::micro>(end - start).count() / cycles;
  for (int r = 0; r < n; ++r) row.all_ran &= ran[r] == tensors * cycles;
  return row;
}

int Log2Ceil(int n) { return n <= 1 ? 0 : static_cast<int>(std::ceil(std::log2(n))); }

}  // namespace

int main(int argc, char** argv) {
  bool check = false;
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--check") == 0) {
      check = true;
    } else {
      sizes.push_back(std::atoi(argv[i]));
    }
  }
  if (sizes.empty()) sizes = check ? std::vector<int>{2, 4, 8, 16, 32} : std::vector<int>{2, 8, 32, 128, 256};
  if (!check) {
    std::printf("# negotiation cycle cost on threads as ranks; per cycle, rank 0's view\n");
    std::printf("# mpi_rounds: ceil(log2 n) for the AND, + 2 ceil(log2 n) when names are "
                "exchanged (gather + broadcast trees)\n");
    std::printf("%6s %7s %8s %7s %9s %8s %14s %12s %10s %14s\n", "ranks", "tensors", "mode",
                "and_ops", "and_bytes", "gathers", "root_gathered", "bcast_bytes", "mpi_rounds",
                "harness_us");
  }
  for (int n : sizes) {
    for (int tensors : {1, 200}) {
      for (bool cached : {true, false}) {
        const int cycles = check ? 3 : (n >= 128 ? 5 : 20);
        Row row = Measure(n, tensors, cached, 2, cycles);
        const bool exchanged = row.per_cycle.gathers > 0;
        const int rounds = Log2Ceil(n) * (exchanged ? 3 : 1);
        if (!check) {
          std::printf("%6d %7d %8s %7d %9zu %8d %14zu %12zu %10d %14.1f\n", n, tensors,
                      cached ? "cached" : "uncached", row.per_cycle.and_ops,
                      row.per_cycle.and_bytes, row.per_cycle.gathers,
                      row.per_cycle.gathered_at_root, row.per_cycle.broadcast_bytes, rounds,
                      row.us_per_cycle);
          std::fflush(stdout);
          continue;
        }
        const std::string label = std::to_string(n) + " ranks, " + std::to_string(tensors) +
                                  (cached ? " cached" : " uncached");
        Expect(row.all_ran, label + ": every tensor ran in its cycle on every rank");
        // A cached cycle is one AND and nothing else, whatever the ranks:
        // log2(n) rounds of the same few words on MPI.
        if (cached) {
          Expect(row.per_cycle.and_ops == 1 && row.per_cycle.gathers == 0 &&
                     row.per_cycle.broadcasts == 0,
                 label + ": one AND per cycle, no exchange by name");
          // Words: flags, two bits per cache slot, one bit per rank.
          Expect(row.per_cycle.and_bytes <= 8 * (1 + 2 * ((Config().cache_capacity + 63) / 64) +
                                                 (n + 63) / 64),
                 label + ": the AND carries flags, two bits per slot and one per rank");
        } else {
          Expect(row.per_cycle.and_ops == 1 && row.per_cycle.gathers == 1 &&
                     row.per_cycle.broadcasts == 1,
                 label + ": one AND, one gather and one broadcast per cycle");
          // Every rank's names reach the root: at least one name's bytes
          // per rank and tensor.
          Expect(row.per_cycle.gathered_at_root >= static_cast<size_t>(n * tensors) * 5,
                 label + ": every rank's names reach rank 0");
        }
      }
    }
  }
  return check ? ddl_test::Summary() : 0;
}
