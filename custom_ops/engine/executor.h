// Runs collectives that negotiation has cleared: packs allreduces into the
// fusion buffer, picks the algorithm, and fills each output. Called only
// from the engine thread, identically ordered on every rank.
#pragma once

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "../algorithms/node_allreduce.h"
#include "../algorithms/shared_output_allreduce.h"
#include "../tuning/autotune.h"
#include "context.h"
#include "work.h"

namespace ddl {

class Executor {
 public:
  explicit Executor(Context& ctx);

  // Runs `ready` (same order on every rank); fuses allreduces with the same
  // dtype and op up to the fusion threshold. Calls every done callback.
  // `active`: ranks whose data counts (the others have joined and send
  // zeros), the divisor of an Average.
  void Run(std::vector<Work>& ready, int active);
  const TrafficCounters& traffic() const { return traffic_; }
  // The fusion threshold and cycle time in force: the configured ones, or
  // DDL_AUTOTUNE's (any thread may ask).
  AutotuneSetting settings() const { return {fusion_threshold_mb_.load(), cycle_time_ms_.load()}; }

 private:
  // Phase name and seconds, of one batch, for the timeline.
  using Phases = std::vector<std::pair<const char*, double>>;
  void AllreduceBatch(std::vector<Work*>& batch, int active);
  // The batch's paths (outputs already allocated): through the node's
  // shared memory, or the flat algorithm over the world (fusion buffer).
  // `active` divides an Average (the ranks whose data counts).
  void NodeMemoryAllreduce(std::vector<Work*>& batch, ReduceOp op, int active, Phases* phases);
  // Whether a batch of `total` bytes takes the node's single pass
  // (NodeAllreduce::RunSmall, chosen by ChooseSinglePass).
  bool SmallOnNode(size_t total) const;
  void FlatAllreduce(std::vector<Work*>& batch, ReduceOp op, int active, size_t total,
                     Phases* phases);
  void RecordAllreduce(const std::vector<Work*>& batch, size_t total,
                       Timeline::Clock::time_point start, const Phases& phases);
  Status Allgather(Work& work);
  Status Broadcast(Work& work);
  Status Reducescatter(Work& work, int active);
  Status Alltoall(Work& work);

  // DDL_UPLINK_COMPRESSION=fp16: every float32 call of the rack grid
  // sends fp16 on the uplinks (=auto leaves it to the autotuner).
  bool UplinksInHalf() const {
    return ctx_.uplink_compression == UplinkCompression::kFp16;
  }

  Context& ctx_;
  TrafficCounters traffic_;
  std::vector<char> fusion_buffer_;
  // Gives an allreduce without an output one; a failed allocation gets
  // scratch memory (the collective must still run on every rank) and its
  // error is returned.
  Status AllocateOutput(Work& work, std::vector<std::vector<char>>* scratch);
  // AllocateOutput for each of `batch`, errors into `status`.
  void AllocateOutputs(std::vector<Work*>& batch, std::vector<Status>* status,
                       std::vector<std::vector<char>>* scratch);
  // Runs `batch` into one result in node shared memory that the outputs
  // view (adopted, or copied to a caller's own output). False, with nothing
  // done, when the node's pool had no room: then the batch runs as usual.
  bool IntoSharedResult(std::vector<Work*>& batch, std::vector<Status>* status,
                        std::vector<std::vector<char>>* scratch,
                        Phases* phases);

  std::unique_ptr<NodeAllreduce> node_allreduce_;  // when the node shares memory
  std::unique_ptr<SharedOutputAllreduce> shared_output_;  // one node with an output pool
  // DDL_AUTOTUNE=1 in the global context with a network step; else null.
  std::unique_ptr<Autotuner> tuner_;
  NetworkChoice network_choice_ = NetworkChoice::kAuto;  // of the batch running
  std::atomic<double> fusion_threshold_mb_, cycle_time_ms_;
};

}  // namespace ddl
