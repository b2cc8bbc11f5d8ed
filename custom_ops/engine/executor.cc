#include "executor.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "../algorithms/allreduce.h"
#include "../algorithms/alltoall.h"
#include "../algorithms/pairwise.h"
#include "../algorithms/rack_allreduce.h"
#include "../algorithms/ring.h"
#include "../common/reduce_kernels.h"
#include "../negotiation/coordinator.h"

namespace ddl {

namespace {
size_t Bytes(const Work& w) { return NumElements(w.shape) * DataTypeSize(w.dtype); }

void CopyUnlessSame(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

// The fusion thresholds and cycle times DDL_AUTOTUNE tries, one knob at a
// time around the configured pair (first, so a tie keeps it): a grid of
// both would take the product of the two lists in windows, most of a
// short job. Thresholds: smaller batches start sooner (more overlap with
// the backward pass), larger ones pay fewer fixed costs; 4 MiB is about
// where a message's fixed cost (tens of microseconds) falls to a few
// percent of its transfer on 10-100 Gb/s links, 64 MiB is Horovod's
// default (what a job ported from it ran with), 16 MiB between. Cycle
// times: half and twice the configured one, and 5 ms, a wait long enough
// to gather many of a backward pass's gradients into one round.
std::vector<AutotuneSetting> SettingCandidates(const Config& config) {
  const AutotuneSetting configured{config.fusion_threshold_mb, config.cycle_time_ms};
  std::vector<AutotuneSetting> out = {configured};
  auto add = [&out](AutotuneSetting s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  for (double mb : {4.0, 16.0, 64.0}) add({mb, configured.cycle_time_ms});
  for (double ms : {configured.cycle_time_ms / 2, configured.cycle_time_ms * 2, 5.0}) {
    // The range DDL_CYCLE_TIME_MS accepts (common/settings.def).
    if (ms >= 0.01 && ms <= 10000) add({configured.fusion_threshold_mb, ms});
  }
  return out;
}

// DDL_AUTOTUNE=1: a tuner of the context's network step (the rack grid,
// the cross-node step or the flat world), with the algorithms that
// really exist for it; null where nothing goes over a network or in a
// process set (which keep the size rule).
std::unique_ptr<Autotuner> MakeTuner(const Context& ctx) {
  if (!ctx.config.autotune || ctx.process_set != 0) return nullptr;
  std::string step;
  std::vector<AutotuneCandidate> candidates;
  if (ctx.racks && ctx.rack_all && ctx.rack_all->size() > 1) {
    step = "racks";
    // The one-round exchange only below 1 MiB (size classes 0-1), as the
    // world's below.
    candidates = {{"RACK_ORDERED_EXCHANGE", NetworkChoice::kRackExchange, 1},
                  {"RACK_ALLREDUCE_256K", NetworkChoice::kRackPipeline256K},
                  {"RACK_ALLREDUCE_1M", NetworkChoice::kRackPipeline1M},
                  {"RACK_ALLREDUCE_SIZED", NetworkChoice::kRackPipelineSized}};
    // DDL_UPLINK_COMPRESSION=auto: the sized pipeline with fp16 uplinks
    // too (float32 batches; others run it plain). With =fp16 every
    // candidate already sends fp16 there.
    if (ctx.uplink_compression == UplinkCompression::kAuto) {
      candidates.push_back({"RACK_ALLREDUCE_SIZED_FP16UP", NetworkChoice::kRackPipelineSizedFp16Up});
    }
  } else if (ctx.node_memory ? ctx.hierarchical : ctx.size > 1) {
    step = ctx.node_memory ? "cross-node" : "world";
    // The one-round exchange only below 1 MiB (size classes 0-1); the
    // chain with 3 or more nodes (with two it sends what the pairwise
    // ring sends, through the same two links).
    const int nodes = ctx.node_memory ? ctx.cross_size : ctx.size;
    for (const TransportAllreduce& a : AllreduceAlgorithms()) {
      if (a.choice == NetworkChoice::kChain && nodes < 3) continue;
      candidates.push_back({a.name, a.choice, a.choice == NetworkChoice::kDirectExchange ? 1 : -1});
    }
    // The node's single pass across nodes (up to a slot: classes 0-2).
    if (ctx.node_memory) candidates.push_back({"NODE_LEADER_EXCHANGE", NetworkChoice::kNodeLeader, 2});
  } else {
    if (ctx.rank == 0) {
      std::fprintf(stderr, "keras_ddl autotune: nothing to tune: no allreduce step goes over "
                           "the network (%d rank(s), one node)\n", ctx.size);
    }
    return nullptr;
  }
  const std::string shape =
      "ranks=" + std::to_string(ctx.size) + " local=" + std::to_string(ctx.local_size) +
      " nodes=" + std::to_string(ctx.cross_size) +
      " racks=" + std::to_string(ctx.racks ? ctx.topology.num_racks() : 1) + " step=" + step +
      // A table measured with fp16 uplinks on every call is not reused
      // without them, nor the other way round.
      (step == "racks" && ctx.uplink_compression == UplinkCompression::kFp16
           ? " uplinks=fp16" : "");
  auto tuner = std::make_unique<Autotuner>(*ctx.world, std::move(candidates),
                                           ctx.config.autotune_steps, step, shape,
                                           ctx.config.autotune_file);
  tuner->TuneSettings(SettingCandidates(ctx.config), ctx.config.autotune_cycles);
  return tuner;
}
}  // namespace

void Executor::Run(std::vector<Work>& ready, int active) {
  size_t cycle_bytes = 0;
  bool allreduces = false;
  for (const Work& w : ready) {
    if (w.collective != Collective::kAllreduce) continue;
    allreduces = true;
    cycle_bytes += Bytes(w);
  }
  // The tuner's setting for this cycle: the same on every rank, since the
  // ready list is. The batches below follow from it, and the engine's next
  // wait takes the cycle time.
  if (tuner_ && allreduces) {
    const AutotuneSetting s = tuner_->BeginCycle(cycle_bytes);
    fusion_threshold_mb_ = s.fusion_threshold_mb;
    cycle_time_ms_ = s.cycle_time_ms;
  }
  const size_t threshold = static_cast<size_t>(fusion_threshold_mb_.load() * 1024 * 1024);
  // Batches keyed by (dtype, wire dtype, op) in order of first appearance:
  // the same list on every rank gives the same batches everywhere.
  std::vector<std::vector<Work*>> batches;
  std::vector<size_t> batch_bytes;  // parallel to batches
  std::map<std::tuple<DataType, DataType, ReduceOp>, size_t> open;  // key -> batch index
  for (Work& w : ready) {
    if (w.collective != Collective::kAllreduce) continue;
    auto key = std::make_tuple(w.dtype, w.wire, w.op);
    auto it = open.find(key);
    if (it == open.end() || batch_bytes[it->second] + Bytes(w) > threshold) {
      batches.emplace_back();
      batch_bytes.push_back(0);
      it = open.insert_or_assign(key, batches.size() - 1).first;
    }
    batches[it->second].push_back(&w);
    batch_bytes[it->second] += Bytes(w);
  }
  for (auto& batch : batches) AllreduceBatch(batch, active);

  for (Work& w : ready) {
    Status s;
    const auto start = Timeline::Clock::now();
    switch (w.collective) {
      case Collective::kAllreduce:
        continue;  // done above
      case Collective::kAllgather:
        s = Allgather(w);
        break;
      case Collective::kBroadcast:
        s = Broadcast(w);
        break;
      case Collective::kReducescatter:
        s = Reducescatter(w, active);
        break;
      case Collective::kAlltoall:
        s = Alltoall(w);
        break;
      case Collective::kBarrier:
      case Collective::kJoin:  // the engine keeps joins; none reaches here
        break;  // agreement by every rank already was the barrier
    }
    if (ctx_.timeline) {
      std::string phase = CollectiveName(w.collective);
      for (char& c : phase) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      ctx_.timeline->Span(w.name, phase, start, Timeline::Clock::now(),
                          "\"bytes\": " + std::to_string(Bytes(w)));
    }
    Finish(w, s);
  }
}

Executor::Executor(Context& ctx)
    : ctx_(ctx),
      fusion_threshold_mb_(ctx.config.fusion_threshold_mb),
      cycle_time_ms_(ctx.config.cycle_time_ms) {
  if (ctx_.node_memory) {
    node_allreduce_ = std::make_unique<NodeAllreduce>(
        *ctx_.node_memory, ctx_.hierarchical ? ctx_.cross.get() : nullptr, ctx_.size, traffic_);
    node_allreduce_->SetNetworkShape(ctx_.network);
    if (ctx_.racks) {
      node_allreduce_->UseRacks({ctx_.rack_all.get(), ctx_.rack_row.get(), ctx_.rack_column.get(),
                                 UplinksInHalf()});
    }
  }
  if (node_allreduce_ && ctx_.output_pool) {
    shared_output_ = std::make_unique<SharedOutputAllreduce>(*ctx_.node_memory, ctx_.output_pool,
                                                             *node_allreduce_);
  }
  tuner_ = MakeTuner(ctx_);
}

Status Executor::AllocateOutput(Work& w, std::vector<std::vector<char>>* scratch) {
  if (w.output != nullptr) return Status::Ok();
  Status s = w.allocate ? w.allocate(w.shape, &w.output)
                        : Status::Internal("allreduce '" + w.name + "' has no output");
  // An empty tensor may have no buffer at all.
  if (s.ok() && (w.output != nullptr || Bytes(w) == 0)) return s;
  scratch->emplace_back(std::max<size_t>(Bytes(w), 1));
  w.output = scratch->back().data();
  return s.ok() ? Status::Internal("no output for allreduce '" + w.name + "'") : s;
}

void Executor::AllocateOutputs(std::vector<Work*>& batch, std::vector<Status>* status,
                               std::vector<std::vector<char>>* scratch) {
  for (size_t i = 0; i < batch.size(); ++i) (*status)[i] = AllocateOutput(*batch[i], scratch);
}

bool Executor::IntoSharedResult(std::vector<Work*>& batch, std::vector<Status>* status,
                                std::vector<std::vector<char>>* scratch,
                                Phases* phases) {
  const auto start = Timeline::Clock::now();
  std::vector<Span> spans;
  for (Work* w : batch) spans.push_back({w->input, nullptr, NumElements(w->shape)});
  std::vector<SharedOutputAllreduce::Output> results;
  NodePhaseTimes times;
  if (!shared_output_->Run(spans, batch[0]->dtype, batch[0]->wire, batch[0]->op, &results,
                           &times)) {
    phases->emplace_back("SHM_OUTPUT_POOL_FULL",
                         std::chrono::duration<double>(Timeline::Clock::now() - start).count());
    return false;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Work& w = *batch[i];
    if (w.adopt && w.output == nullptr) {
      w.adopt(results[i].data, std::move(results[i].hold));
      continue;
    }
    // A caller that brought its own output, or cannot adopt one, gets a copy.
    (*status)[i] = AllocateOutput(w, scratch);
    CopyUnlessSame(w.output, results[i].data, Bytes(w));
  }
  *phases = {{"SHM_COPY_IN", times.copy_in},
             {"INTRA_NODE_REDUCE_SCATTER", times.reduce_scatter},
             {"CROSS_NODE_ALLREDUCE", times.cross_node},
             {"INTRA_NODE_WRITE_SHARED_RESULT", times.all_gather}};
  return true;
}

void Executor::AllreduceBatch(std::vector<Work*>& batch, int active) {
  // While ranks have joined, an Average divides by the ranks that are
  // still active: over a 16-bit wire before the wire, as every Average
  // there (NodeMemoryAllreduce, FlatAllreduce); otherwise the batch is
  // summed and each rank divides its own output (so never into a result
  // the node shares).
  const bool average_of_active = batch[0]->op == ReduceOp::kAverage && active < ctx_.size;
  const bool divide_after = average_of_active && batch[0]->wire == batch[0]->dtype;
  const ReduceOp op = divide_after ? ReduceOp::kSum : batch[0]->op;
  size_t total = 0;
  for (Work* w : batch) total += Bytes(*w);
  const auto start = Timeline::Clock::now();
  // Every rank runs the same batches in the same order, so the tuner's
  // plan (and, once decided, its choice) is the same on every rank.
  Autotuner::Ticket ticket;
  network_choice_ = tuner_ ? tuner_->Before(total, &ticket) : NetworkChoice::kAuto;
  if (node_allreduce_) node_allreduce_->SetNetworkChoice(network_choice_);
  const auto timed_from = Timeline::Clock::now();  // after the tuner's first broadcast
  Phases phases;
  std::vector<Status> status(batch.size());
  std::vector<std::vector<char>> scratch;
  // A small result is not worth the pool's extra round (its block's
  // offset is announced to every local rank before the data moves).
  if (shared_output_ && total > 0 && !average_of_active && !SmallOnNode(total) &&
      IntoSharedResult(batch, &status, &scratch, &phases)) {
    traffic_.shared_output_bytes += total;
  } else if (node_allreduce_) {
    AllocateOutputs(batch, &status, &scratch);
    NodeMemoryAllreduce(batch, op, active, &phases);
  } else {
    AllocateOutputs(batch, &status, &scratch);
    FlatAllreduce(batch, op, active, total, &phases);
  }
  if (tuner_) {
    tuner_->After(ticket,
                  std::chrono::duration<double>(Timeline::Clock::now() - timed_from).count());
  }
  if (ctx_.timeline) RecordAllreduce(batch, total, start, phases);
  if (divide_after) {
    for (Work* w : batch) DivideBy(w->output, NumElements(w->shape), w->dtype, active);
  }
  for (size_t i = 0; i < batch.size(); ++i) Finish(*batch[i], status[i]);
}

bool Executor::SmallOnNode(size_t total) const {
  // The rule: ChooseSinglePass (topology/choose_allreduce.h).
  return node_allreduce_ && node_allreduce_->FitsSmall(total);
}

void Executor::NodeMemoryAllreduce(std::vector<Work*>& batch, ReduceOp op, int active,
                                   Phases* phases) {
  // Reads inputs and writes outputs in place: no fusion-buffer copies.
  std::vector<Span> spans;
  size_t total = 0;
  for (Work* w : batch) {
    spans.push_back({w->input, w->output, NumElements(w->shape)});
    total += Bytes(*w);
  }
  NodePhaseTimes times;
  if (SmallOnNode(total)) {
    node_allreduce_->RunSmall(spans, batch[0]->dtype, batch[0]->wire, op, &times, active);
    phases->insert(phases->end(), {{"SHM_COPY_IN", times.copy_in},
                                   {"SHM_SMALL_REDUCE", times.reduce_scatter}});
    if (node_allreduce_->Across()) {
      phases->insert(phases->end(), {{"SMALL_CROSS_NODE", times.cross_node},
                                     {"SHM_SMALL_COPY_OUT", times.all_gather}});
    }
    return;
  }
  node_allreduce_->Run(spans, batch[0]->dtype, batch[0]->wire, op, &times, nullptr, active);
  phases->insert(phases->end(), {{"SHM_COPY_IN", times.copy_in},
                                 {"INTRA_NODE_REDUCE_SCATTER", times.reduce_scatter},
                                 {"CROSS_NODE_ALLREDUCE", times.cross_node},
                                 {"INTRA_NODE_ALL_GATHER", times.all_gather}});
}

void Executor::FlatAllreduce(std::vector<Work*>& batch, ReduceOp op, int active, size_t total,
                             Phases* phases) {
  using Clock = Timeline::Clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const DataType dtype = batch[0]->dtype;
  const DataType wire = batch[0]->wire;  // the batch's key: the same for all
  // A single tensor is reduced in its output; several, or a tensor sent
  // in another dtype, are packed (converted) into the fusion buffer first.
  const bool packed = batch.size() > 1 || wire != dtype;
  // An Average over a 16-bit wire divides each value by the active ranks
  // as it packs it, then sums: values near the 16-bit maximum stay finite
  // (a float16 sum of two 40000s is inf, their halves' sum is not).
  const bool divide_first = op == ReduceOp::kAverage && wire != dtype;
  if (divide_first) op = ReduceOp::kSum;
  const int64_t count = static_cast<int64_t>(total / DataTypeSize(dtype));
  const size_t wire_elem = DataTypeSize(wire);
  char* buffer = static_cast<char*>(batch[0]->output);
  auto t = Clock::now();
  if (!packed) {
    CopyUnlessSame(buffer, batch[0]->input, total);
  } else {
    if (fusion_buffer_.size() < count * wire_elem) fusion_buffer_.resize(count * wire_elem);
    buffer = fusion_buffer_.data();
    size_t offset = 0;
    for (Work* w : batch) {
      if (divide_first) {
        ConvertDivided(buffer + offset, wire, w->input, dtype, NumElements(w->shape), active);
      } else {
        Convert(buffer + offset, wire, w->input, dtype, NumElements(w->shape));
      }
      offset += NumElements(w->shape) * wire_elem;
    }
  }
  phases->emplace_back("MEMCPY_IN_FUSION_BUFFER", seconds_since(t));
  t = Clock::now();
  if (ctx_.racks) {
    // One rank per node: the grid is the world, racks-major.
    const char* name = RackGridAllreduce(
        {ctx_.rack_all.get(), ctx_.rack_row.get(), ctx_.rack_column.get(), UplinksInHalf()},
        buffer, count, wire, op, 0, network_choice_);
    phases->emplace_back(name, seconds_since(t));
    traffic_.rack_bytes += count * wire_elem;
  } else {
    const TransportAllreduce& algorithm = FlatAlgorithm(
        ChooseAllreduce(ctx_.size, count * wire_elem, network_choice_, ctx_.network));
    algorithm.run(*ctx_.world, buffer, count, wire, op);
    phases->emplace_back(algorithm.name, seconds_since(t));
    traffic_.flat_bytes += count * wire_elem;
  }
  t = Clock::now();
  if (packed) {
    size_t offset = 0;
    for (Work* w : batch) {
      Convert(w->output, dtype, buffer + offset, wire, NumElements(w->shape));
      offset += NumElements(w->shape) * wire_elem;
    }
  }
  phases->emplace_back("MEMCPY_OUT_FUSION_BUFFER", seconds_since(t));
}

void Executor::RecordAllreduce(const std::vector<Work*>& batch, size_t total,
                               Timeline::Clock::time_point start, const Phases& phases) {
  using Clock = Timeline::Clock;
  const auto end = Clock::now();
  const std::string args = "\"batch_tensors\": " + std::to_string(batch.size()) +
                           ", \"batch_bytes\": " + std::to_string(total);
  for (Work* w : batch) {
    ctx_.timeline->Span(w->name, "ALLREDUCE", start, end,
                        args + ", \"bytes\": " + std::to_string(Bytes(*w)));
    // Phases laid out one after another on each tensor's row.
    auto at = start;
    for (const auto& [phase, secs] : phases) {
      auto next = at + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(secs));
      ctx_.timeline->Span(w->name, phase, at, next);
      at = next;
    }
  }
}

Status Executor::Allgather(Work& w) {
  // A scalar is gathered as a single row; otherwise rows run along axis 0.
  std::vector<int64_t> shape = w.shape.empty() ? std::vector<int64_t>{1} : w.shape;
  int64_t row_elems = 1;
  for (size_t i = 1; i < shape.size(); ++i) row_elems *= shape[i];
  const int64_t first = shape[0];
  std::vector<int64_t> firsts = ctx_.world->AllgatherInt64(first);
  std::vector<int64_t> out_shape = shape;
  out_shape[0] = 0;
  // Negotiation refused outputs past 2^31 - 1 bytes (Coordinator::
  // AllgatherTooLarge), but a cached name is not renegotiated when only a
  // rank's first dimension changed: every rank has the same sizes here, so
  // every rank refuses it alike, before any data moves.
  unsigned __int128 wide = 0;
  std::string each;
  for (size_t r = 0; r < firsts.size(); ++r) {
    const unsigned __int128 b = static_cast<unsigned __int128>(std::max<int64_t>(firsts[r], 0)) *
                                static_cast<uint64_t>(row_elems) * DataTypeSize(w.dtype);
    wide += b;
    each += (r ? ", rank " : "rank ") + std::to_string(ctx_.world->WorldRank(static_cast<int>(r))) +
            ": " + std::to_string(static_cast<uint64_t>(b));
  }
  if (wide > static_cast<unsigned __int128>(Coordinator::kMaxAllgatherBytes)) {
    return Status::InvalidArgument(
        "allgather of tensor '" + w.name + "': the output would hold more than " +
        std::to_string(Coordinator::kMaxAllgatherBytes) + " bytes (2^31 - 1), the most one " +
        "allgather can place (MPI counts are ints): " + each + "; gather the tensor in parts" +
        ctx_.Where());
  }
  std::vector<size_t> bytes(firsts.size());
  size_t total = 0;
  for (size_t r = 0; r < firsts.size(); ++r) {
    out_shape[0] += firsts[r];
    bytes[r] = firsts[r] * row_elems * DataTypeSize(w.dtype);
    total += bytes[r];
  }
  // Without an output this rank still takes part (into scratch): the
  // others are already in the collective, and skipping it would pair
  // their next collective with something else.
  void* out = nullptr;
  std::vector<char> scratch;
  Status s = w.allocate(out_shape, &out);
  if (!s.ok() || (out == nullptr && total > 0)) {
    scratch.resize(std::max<size_t>(total, 1));
    out = scratch.data();
    if (s.ok()) s = Status::Internal("no output for allgather '" + w.name + "'");
  }
  ctx_.world->AllgatherV(w.input, Bytes(w), out, bytes);
  return s;
}

Status Executor::Broadcast(Work& w) {
  if (ctx_.rank == w.root) CopyUnlessSame(w.output, w.input, Bytes(w));
  ctx_.world->Broadcast(w.output, Bytes(w), w.root);
  return Status::Ok();
}

Status Executor::Reducescatter(Work& w, int active) {
  const int n = ctx_.size;
  const int64_t rows = w.shape[0];
  const int64_t row_elems = rows == 0 ? 0 : NumElements(w.shape) / rows;
  std::vector<int64_t> row_counts = EvenSegments(rows, n);
  std::vector<int64_t> out_shape = w.shape;
  out_shape[0] = row_counts[ctx_.rank];
  std::vector<int64_t> counts(n);
  int64_t my_offset = 0;
  for (int r = 0; r < n; ++r) {
    counts[r] = row_counts[r] * row_elems;
    if (r < ctx_.rank) my_offset += counts[r];
  }
  const size_t elem = DataTypeSize(w.dtype);
  // As in Allgather: a rank without an output still takes part.
  void* out = nullptr;
  Status s = w.allocate(out_shape, &out);
  // The exchange reduces in place, so it works on a copy of the input.
  std::vector<char> work(Bytes(w));
  CopyUnlessSame(work.data(), w.input, work.size());
  // As in AllreduceBatch: while ranks have joined, Average divides by the
  // active ranks.
  const bool average_of_active = w.op == ReduceOp::kAverage && active < n;
  PairwiseReduceScatter(*ctx_.world, work.data(), counts, w.dtype,
                        average_of_active ? ReduceOp::kSum : w.op);
  if (average_of_active) {
    DivideBy(work.data() + my_offset * elem, counts[ctx_.rank], w.dtype, active);
  }
  if (!s.ok()) return s;
  if (out == nullptr && counts[ctx_.rank] > 0) {
    return Status::Internal("no output for reducescatter '" + w.name + "'");
  }
  CopyUnlessSame(out, work.data() + my_offset * elem, counts[ctx_.rank] * elem);
  return Status::Ok();
}

Status Executor::Alltoall(Work& w) {
  // Negotiation refused scalars and checked w.splits (one entry per rank,
  // summing to the rows), so rows of axis 0 go to ranks in order.
  const int n = ctx_.size;
  const int me = ctx_.rank;
  int64_t row_elems = 1;
  for (size_t d = 1; d < w.shape.size(); ++d) row_elems *= w.shape[d];
  const size_t row_bytes = static_cast<size_t>(row_elems) * DataTypeSize(w.dtype);
  // Receivers learn their row counts before any data moves, so each can
  // allocate its output once, with its final shape.
  const std::vector<int64_t> from_each = ExchangeCounts(*ctx_.world, w.splits);
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  std::vector<int64_t> out_shape = w.shape;
  out_shape[0] = 0;
  for (int r = 0; r < n; ++r) {
    send_bytes[r] = static_cast<size_t>(w.splits[r]) * row_bytes;
    recv_bytes[r] = static_cast<size_t>(from_each[r]) * row_bytes;
    out_shape[0] += from_each[r];
  }
  const size_t total = static_cast<size_t>(out_shape[0]) * row_bytes;
  // As in Allgather: without an output this rank still takes part (into
  // scratch), or the others' next collective would pair with another one.
  void* out = nullptr;
  std::vector<char> scratch;
  Status s = w.allocate(out_shape, &out);
  if (s.ok() && w.received_splits) s = w.received_splits(from_each);
  if (!s.ok() || (out == nullptr && total > 0)) {
    scratch.resize(std::max<size_t>(total, 1));
    out = scratch.data();
    if (s.ok()) s = Status::Internal("no output for alltoall '" + w.name + "'");
  }
  PairwiseAlltoall(*ctx_.world, w.input, send_bytes, out, recv_bytes);
  uint64_t sent = 0;
  for (int r = 0; r < n; ++r) sent += r == me ? 0 : send_bytes[r];
  traffic_.alltoall_bytes += sent;
  return s;
}

}  // namespace ddl
