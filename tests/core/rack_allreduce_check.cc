// The rack allreduce (algorithms/rack_allreduce.h) with threads as ranks:
// R racks x N nodes, one group per rack and one per column across racks
// (tests/core/in_process.h). Element counts around piece and segment
// boundaries, pieces from one element per message to whole, messages
// limited to a few bytes so the pipeline runs many steps. Checked against
// the promised order computed here from the inputs (each rack's nodes in
// node order, then the racks in rack order; one division for Average):
// bitwise on every rank, so also identical across ranks and independent
// of the piece size. The same with fp16 on the uplinks (half_uplinks),
// against the promised float16 rounding. Also checks the choice rule. Prints
// "<N> checks, <F> failures".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "algorithms/rack_allreduce.h"
#include "common/reduce_kernels.h"
#include "check.h"
#include "in_process.h"
#include "reference.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;
using ddl_test::Combine;
using ddl_test::TypeOf;

namespace {

// in[rank], rank = rack * nodes + node.
template <typename T>
std::vector<T> Expected(const std::vector<std::vector<T>>& in, int racks, int nodes, ReduceOp op) {
  const size_t count = in.empty() ? 0 : in[0].size();
  std::vector<T> want(count);
  for (size_t i = 0; i < count; ++i) {
    T total = 0;
    for (int r = 0; r < racks; ++r) {
      T rack_value = in[r * nodes][i];
      for (int n = 1; n < nodes; ++n) rack_value = Combine(op, rack_value, in[r * nodes + n][i]);
      total = r == 0 ? rack_value : Combine(op, total, rack_value);
    }
    want[i] = op == ReduceOp::kAverage ? total / static_cast<T>(racks * nodes) : total;
  }
  return want;
}

enum class Run { kSchedule, kExchange, kGrid };

float ThroughHalf(float x) { return HalfToFloat(FloatToHalf(x)); }

// fp16 on the uplinks, as promised (rack_allreduce.h): each rack's float32
// partial (its nodes in node order) rounded to float16, the racks combined
// in rack order in float32, one division for Average, the result rounded
// to float16. With one rack nothing crosses an uplink: no rounding.
std::vector<float> ExpectedHalfUplinks(const std::vector<std::vector<float>>& in, int racks,
                                       int nodes, ReduceOp op) {
  const size_t count = in.empty() ? 0 : in[0].size();
  std::vector<float> want(count);
  const bool half = racks > 1;
  for (size_t i = 0; i < count; ++i) {
    float total = 0;
    for (int r = 0; r < racks; ++r) {
      float rack_value = in[r * nodes][i];
      for (int n = 1; n < nodes; ++n) rack_value = Combine(op, rack_value, in[r * nodes + n][i]);
      if (half) rack_value = ThroughHalf(rack_value);
      total = r == 0 ? rack_value : Combine(op, total, rack_value);
    }
    if (op == ReduceOp::kAverage) total = total / static_cast<float>(racks * nodes);
    want[i] = half ? ThroughHalf(total) : total;
  }
  return want;
}

enum class HalfRun { kSchedule, kExchange, kGridFlag, kGridChoice };

// One float32 allreduce over the grid with fp16 uplinks, every rank's
// result against ExpectedHalfUplinks bitwise; then the same inputs without
// them (the plain order), comparing what crossed the uplinks: exactly half
// the bytes with fp16 (the pipeline), the same bytes inside the racks.
// Values up to `scale` in magnitude, so partials need float16's range.
void CheckHalfUplinks(int racks, int nodes, int64_t count, ReduceOp op, size_t max_message,
                      size_t piece_bytes, HalfRun run, std::mt19937& rng, float scale = 1.0f) {
  const int world = racks * nodes;
  std::uniform_real_distribution<float> real(-scale, scale);
  std::vector<std::vector<float>> inputs(world, std::vector<float>(count));
  for (auto& v : inputs) {
    // Large values all positive: inf, never inf - inf (a NaN whose bits
    // the float16 kernels need not keep).
    for (auto& x : v) x = scale > 1 ? std::fabs(real(rng)) : real(rng);
  }
  const std::string label =
      std::string("fp16 uplinks ") +
      (run == HalfRun::kSchedule   ? "schedule "
       : run == HalfRun::kExchange ? "exchange "
       : run == HalfRun::kGridFlag ? "grid(flag) "
                                   : "grid(choice) ") +
      std::to_string(racks) + " racks x " + std::to_string(nodes) + " nodes count=" +
      std::to_string(count) + " " + ReduceOpName(op) + " max_message=" +
      std::to_string(max_message) + " piece=" + std::to_string(piece_bytes);
  std::vector<uint64_t> rack_sent[2], across_sent[2];
  std::vector<std::string> ran(world);
  for (int half = 1; half >= 0; --half) {
    std::vector<std::vector<float>> data = inputs;
    std::vector<std::unique_ptr<InProcessGroup>> rack_groups, columns;
    for (int r = 0; r < racks; ++r) {
      rack_groups.push_back(std::make_unique<InProcessGroup>(nodes, max_message));
    }
    for (int n = 0; n < nodes; ++n) {
      columns.push_back(std::make_unique<InProcessGroup>(racks, max_message));
    }
    InProcessGroup everyone(world, max_message);
    rack_sent[half].assign(world, 0);
    across_sent[half].assign(world, 0);
    everyone.Run([&](int w) {
      InProcessRank rack(*rack_groups[w / nodes], w % nodes);
      InProcessRank across(*columns[w % nodes], w / nodes);
      InProcessRank all(everyone, w);
      float* buffer = data[w].data();
      switch (run) {
        case HalfRun::kSchedule:
          RackAllreduce(rack, across, buffer, count, DataType::kFloat32, op, piece_bytes, half);
          break;
        case HalfRun::kExchange:
          RackOrderedExchange(all, nodes, buffer, count, DataType::kFloat32, op, half);
          break;
        case HalfRun::kGridFlag: {
          RackGrid grid{&all, &rack, &across};
          grid.half_uplinks = half;
          ran[w] = RackGridAllreduce(grid, buffer, count, DataType::kFloat32, op, piece_bytes);
          break;
        }
        case HalfRun::kGridChoice:
          ran[w] = RackGridAllreduce({&all, &rack, &across}, buffer, count, DataType::kFloat32,
                                     op, piece_bytes,
                                     half ? NetworkChoice::kRackPipelineSizedFp16Up
                                          : NetworkChoice::kRackPipelineSized);
          break;
      }
      rack_sent[half][w] = rack.sent_bytes();
      across_sent[half][w] = across.sent_bytes();
      Expect(rack.empty_messages() == 0 && across.empty_messages() == 0,
             label + ": no empty messages");
    });
    const std::vector<float> want = half ? ExpectedHalfUplinks(inputs, racks, nodes, op)
                                         : Expected(inputs, racks, nodes, op);
    for (int w = 0; w < world; ++w) {
      const bool same = count == 0 ||
                        std::memcmp(want.data(), data[w].data(), count * sizeof(float)) == 0;
      Expect(same, label + (half ? "" : " (plain)") + " rank " + std::to_string(w) +
                       " is not the promised result");
    }
    if (half && (run == HalfRun::kGridFlag || run == HalfRun::kGridChoice) && world > 1 &&
        count > 0) {
      const bool small = run == HalfRun::kGridFlag &&
                         (world - 1) * count * sizeof(float) <= kRackDirectExchangeBytes;
      std::string name = run == HalfRun::kGridChoice ? "RACK_ALLREDUCE_SIZED"
                         : small                     ? "RACK_ORDERED_EXCHANGE"
                                                     : "RACK_ALLREDUCE";
      if (racks > 1) name += "_FP16UP";  // one rack: no uplink, plain float32
      Expect(ran[0] == name, label + " ran " + ran[0] + ", not " + name);
    }
  }
  // The pipeline: half the bytes across racks, the same inside them.
  if (run != HalfRun::kExchange && !(run == HalfRun::kGridFlag &&
      (world - 1) * count * sizeof(float) <= kRackDirectExchangeBytes)) {
    for (int w = 0; w < world; ++w) {
      Expect(rack_sent[1][w] == rack_sent[0][w] &&
                 2 * across_sent[1][w] == across_sent[0][w],
             label + " rank " + std::to_string(w) + ": sent " + std::to_string(rack_sent[1][w]) +
                 " / " + std::to_string(across_sent[1][w]) + " bytes in / across racks, plain " +
                 std::to_string(rack_sent[0][w]) + " / " + std::to_string(across_sent[0][w]));
    }
  }
}

// The float16 rounding is real: without it the result would be the plain
// order's, and 1001 random floats over 2 racks differ in most elements.
void CheckHalfRoundingShows(std::mt19937& rng) {
  std::uniform_real_distribution<float> real(-1, 1);
  std::vector<std::vector<float>> in(4, std::vector<float>(1001));
  for (auto& v : in) {
    for (auto& x : v) x = real(rng);
  }
  const std::vector<float> plain = Expected(in, 2, 2, ReduceOp::kSum);
  const std::vector<float> half = ExpectedHalfUplinks(in, 2, 2, ReduceOp::kSum);
  int differ = 0;
  for (size_t i = 0; i < plain.size(); ++i) differ += plain[i] != half[i];
  Expect(differ > 500, "the fp16-uplink reference differs from float32 in " +
                           std::to_string(differ) + " of 1001 elements (expected most)");
}

// A rank that never calls: every other rank of the grid throws PeerTimeout
// (the schedule polls, then blocks in the transport's wait, which applies
// the timeout) instead of waiting forever. Pieces of many steps, so the
// missing rank's absence shows mid-pipeline for its rack peers.
void CheckAbsentRankTimesOut(int racks, int nodes, int absent) {
  const int world = racks * nodes;
  const int64_t count = 1 << 14;
  std::vector<std::unique_ptr<InProcessGroup>> rack_groups, columns;
  for (int r = 0; r < racks; ++r) rack_groups.push_back(std::make_unique<InProcessGroup>(nodes, 1 << 20));
  for (int n = 0; n < nodes; ++n) columns.push_back(std::make_unique<InProcessGroup>(racks, 1 << 20));
  InProcessGroup everyone(world, 1 << 20);
  std::vector<int> timed_out(world, 0);
  everyone.Run([&](int w) {
    if (w == absent) return;
    InProcessRank rack(*rack_groups[w / nodes], w % nodes);
    InProcessRank across(*columns[w % nodes], w / nodes);
    rack.SetPeerTimeout(0.5);
    across.SetPeerTimeout(0.5);
    std::vector<float> data(count, 1.0f);
    try {
      RackAllreduce(rack, across, data.data(), count, DataType::kFloat32, ReduceOp::kSum, 4096);
    } catch (const PeerTimeout&) {
      timed_out[w] = 1;
    }
  });
  for (int w = 0; w < world; ++w) {
    if (w != absent) {
      Expect(timed_out[w] == 1, "rank " + std::to_string(w) + " of " + std::to_string(racks) +
                                    "x" + std::to_string(nodes) + " times out when rank " +
                                    std::to_string(absent) + " never calls");
    }
  }
}

template <typename T>
void Check(int racks, int nodes, int64_t count, ReduceOp op, size_t max_message,
           size_t piece_bytes, std::mt19937& rng, Run run = Run::kSchedule) {
  const int world = racks * nodes;
  std::uniform_real_distribution<double> real(-1, 1);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<std::vector<T>> data(world, std::vector<T>(count));
  for (auto& v : data) {
    for (auto& x : v) x = std::is_integral<T>::value ? T(small(rng)) : T(real(rng));
  }
  const std::vector<T> want = Expected(data, racks, nodes, op);

  std::vector<std::unique_ptr<InProcessGroup>> rack_groups, columns;
  for (int r = 0; r < racks; ++r) rack_groups.push_back(std::make_unique<InProcessGroup>(nodes, max_message));
  for (int n = 0; n < nodes; ++n) columns.push_back(std::make_unique<InProcessGroup>(racks, max_message));
  InProcessGroup everyone(world, max_message);
  std::vector<std::string> ran(world);
  everyone.Run([&](int w) {
    const int r = w / nodes, n = w % nodes;
    InProcessRank rack(*rack_groups[r], n);
    InProcessRank across(*columns[n], r);
    InProcessRank all(everyone, w);
    if (run == Run::kSchedule) {
      RackAllreduce(rack, across, data[w].data(), count, TypeOf<T>(), op, piece_bytes);
    } else if (run == Run::kExchange) {
      RackOrderedExchange(all, nodes, data[w].data(), count, TypeOf<T>(), op);
    } else {
      ran[w] = RackGridAllreduce({&all, &rack, &across}, data[w].data(), count, TypeOf<T>(), op,
                                 piece_bytes);
    }
    // Every message within the limit (the harness throws otherwise) and
    // a bounded number in flight: on each group kRackRoundsInFlight
    // pieces in each of its two rounds (A and D, or B and C), a send and a
    // receive per peer.
    const int bound = 2 * 2 * kRackRoundsInFlight;
    Expect(rack.max_outstanding() <= bound * (nodes - 1) &&
               across.max_outstanding() <= bound * (racks - 1),
           "rack allreduce keeps at most kRackRoundsInFlight pieces per round in flight");
    Expect(rack.empty_messages() == 0 && across.empty_messages() == 0,
           "rack allreduce sends no empty messages");
  });
  if (run == Run::kGrid && world > 1 && count > 0) {
    // The one-round exchange exactly while the bytes it sends per rank
    // stay within its limit.
    const bool small = (world - 1) * count * sizeof(T) <= kRackDirectExchangeBytes;
    Expect(ran[0] == (small ? "RACK_ORDERED_EXCHANGE" : "RACK_ALLREDUCE"),
           "the grid allreduce of " + std::to_string(count * sizeof(T)) + " bytes over " +
               std::to_string(world) + " ranks ran " + ran[0]);
  }
  const std::string label = std::string(run == Run::kSchedule   ? "schedule "
                                         : run == Run::kExchange ? "exchange "
                                                                 : "grid ") +
                            std::to_string(racks) + " racks x " + std::to_string(nodes) +
                            " nodes count=" + std::to_string(count) + " " + ReduceOpName(op) +
                            " max_message=" + std::to_string(max_message) +
                            " piece=" + std::to_string(piece_bytes);
  for (int w = 0; w < world; ++w) {
    const bool same = count == 0 ||
                      std::memcmp(want.data(), data[w].data(), count * sizeof(T)) == 0;
    Expect(same, label + " rank " + std::to_string(w) + " is not the nodes-then-racks result");
  }
}

}  // namespace

int main() {
  std::mt19937 rng(2027);
  const std::vector<int64_t> counts = {0, 1, 5, 17, 1001};
  for (int racks = 1; racks <= 3; ++racks) {
    for (int nodes = 1; nodes <= 3; ++nodes) {
      for (int64_t count : counts) {
        // 8-byte messages with 12-byte pieces: a pipeline of many steps
        // with segments of 0-1 elements; 40 / 256: a few elements each;
        // 1 MB: one piece for every count here.
        for (auto [max_message, piece] : {std::pair<size_t, size_t>{8, 12}, {40, 256},
                                          {size_t(1) << 20, size_t(1) << 20}}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
            Check<float>(racks, nodes, count, op, max_message, piece, rng);
          }
          Check<double>(racks, nodes, count, ReduceOp::kSum, max_message, piece, rng);
          Check<int32_t>(racks, nodes, count, ReduceOp::kProduct, max_message, piece, rng);
        }
      }
    }
  }
  // The exchange, and the choice between it and the schedule: both give
  // the same order, so a tensor's bits do not depend on which one its
  // fused call took. 20000 floats over 2+ ranks is above the exchange's
  // limit.
  for (int racks = 1; racks <= 3; ++racks) {
    for (int nodes = 1; nodes <= 3; ++nodes) {
      for (int64_t count : {int64_t(0), int64_t(7), int64_t(1001), int64_t(20000)}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin}) {
          Check<float>(racks, nodes, count, op, 40, 256, rng, Run::kExchange);
          Check<float>(racks, nodes, count, op, size_t(1) << 20, 4096, rng, Run::kGrid);
        }
      }
    }
  }
  // fp16 on the uplinks: 1-3 racks x 1-3 nodes, odd lengths, pieces and
  // messages of a few bytes up to one piece, the schedule, the exchange
  // and the grid (by its flag and by the autotuner's choice).
  CheckHalfRoundingShows(rng);
  for (int racks = 1; racks <= 3; ++racks) {
    for (int nodes = 1; nodes <= 3; ++nodes) {
      for (int64_t count : {int64_t(1), int64_t(7), int64_t(1001), int64_t(20001)}) {
        for (auto [max_message, piece] : {std::pair<size_t, size_t>{8, 12}, {40, 256},
                                          {size_t(1) << 20, size_t(1) << 20}}) {
          if (count > 1001 && max_message < 40) continue;  // thousands of steps: slow
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
            CheckHalfUplinks(racks, nodes, count, op, max_message, piece, HalfRun::kSchedule, rng);
          }
        }
        CheckHalfUplinks(racks, nodes, count, ReduceOp::kMin, 40, 256, HalfRun::kSchedule, rng);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          CheckHalfUplinks(racks, nodes, count, op, 40, 256, HalfRun::kExchange, rng);
          CheckHalfUplinks(racks, nodes, count, op, size_t(1) << 20, 4096, HalfRun::kGridFlag, rng);
          CheckHalfUplinks(racks, nodes, count, op, 64, 4096, HalfRun::kGridChoice, rng);
        }
      }
      // Partials past float16's range (up to 3 x 30000 per rack): inf on
      // the uplinks, as promised, on every rank alike.
      CheckHalfUplinks(racks, nodes, 1001, ReduceOp::kSum, 40, 256, HalfRun::kSchedule, rng,
                       30000.0f);
      CheckHalfUplinks(racks, nodes, 1001, ReduceOp::kAverage, 40, 256, HalfRun::kExchange, rng,
                       30000.0f);
    }
  }
  // Other dtypes ignore the option: float64 with half_uplinks is the plain
  // order.
  {
    std::vector<std::vector<double>> in(4, std::vector<double>(1001));
    std::uniform_real_distribution<double> real(-1, 1);
    for (auto& v : in) {
      for (auto& x : v) x = real(rng);
    }
    const std::vector<double> want = Expected(in, 2, 2, ReduceOp::kSum);
    std::vector<std::unique_ptr<InProcessGroup>> rack_groups, columns;
    for (int i = 0; i < 2; ++i) {
      rack_groups.push_back(std::make_unique<InProcessGroup>(2, 64));
      columns.push_back(std::make_unique<InProcessGroup>(2, 64));
    }
    InProcessGroup everyone(4, 64);
    everyone.Run([&](int w) {
      InProcessRank rack(*rack_groups[w / 2], w % 2);
      InProcessRank across(*columns[w % 2], w / 2);
      RackAllreduce(rack, across, in[w].data(), 1001, DataType::kFloat64, ReduceOp::kSum, 512,
                    true);
    });
    for (int w = 0; w < 4; ++w) {
      Expect(std::memcmp(in[w].data(), want.data(), 1001 * sizeof(double)) == 0,
             "float64 with half_uplinks: rank " + std::to_string(w) + " is the plain order");
    }
  }
  CheckAbsentRankTimesOut(2, 2, 3);
  CheckAbsentRankTimesOut(3, 2, 0);
  // The piece size a call takes: 1 MiB, or the whole of a smaller call;
  // a slice's: an eighth within 64 KiB-2 MiB (reasons in rack_allreduce.h).
  ddl_test::Expect(ddl::RackPieceBytes(0) == 1, "piece of an empty call is one byte");
  ddl_test::Expect(ddl::RackPieceBytes(300 << 10) == (300 << 10),
                   "a 300 KiB call is one piece");
  ddl_test::Expect(ddl::RackPieceBytes(64 << 20) == (1 << 20), "piece of a 64 MiB call is 1 MiB");
  ddl_test::Expect(ddl::RackPieceBytes(size_t(1) << 30) == (1 << 20),
                   "piece of a 1 GiB call is 1 MiB");
  ddl_test::Expect(ddl::RackSlicePieceBytes(128 << 10) == (64 << 10),
                   "piece of a 128 KiB slice is the 64 KiB floor");
  ddl_test::Expect(ddl::RackSlicePieceBytes(2 << 20) == (256 << 10),
                   "piece of a 2 MiB slice is an eighth");
  ddl_test::Expect(ddl::RackSlicePieceBytes(64 << 20) == (2 << 20),
                   "piece of a 64 MiB slice is the 2 MiB cap");
  return ddl_test::Summary();
}
