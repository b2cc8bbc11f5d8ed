// The background engine: kernels enqueue Work and return; one thread owns
// all MPI traffic and runs negotiation cycles. In each cycle every rank
// reports what became ready; the coordinator (rank 0) answers with the
// names ready everywhere, in one order, and every rank then executes that
// list. Agreed names enter the response cache, after which a cycle costs
// one small bitwise-AND allreduce.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "context.h"
#include "controller.h"
#include "executor.h"
#include "message.h"
#include "work.h"

namespace ddl {

// Exit code of a process that keras_ddl ended after a failed collective.
constexpr int kDataPathFailureExitCode = 70;

class Engine {
 public:
  explicit Engine(std::unique_ptr<Context> ctx);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Context& context() const { return *ctx_; }
  const TrafficCounters& traffic() const { return executor_.traffic(); }

  // Hands the works to the engine as one unit (they enter the same cycle).
  // Invalid works fail through their done callback before this returns.
  void Enqueue(std::vector<Work> works);

  // Asks every rank's engine to stop after the current cycle and waits for
  // this rank's thread. In-flight works fail with an Aborted status.
  void Shutdown();

  // True once any engine in this process stopped because a peer went
  // silent (died or hung); the process should then end the whole job.
  static bool PeerFailureSeen();

 private:
  void Loop();
  // Returns false when the engine must stop.
  bool RunCycle();
  Status Validate(const Work& work) const;
  void Admit(Work work);
  // This rank's part in a collective it runs while joined: zeros in, the
  // result discarded; the memory lives as long as the work.
  static Work StandIn(const Request& request);
  void FailAll(const Status& status);
  // After a negotiation timeout: finds out which ranks are silent (rank 0
  // collects probes from the live ranks and tells them) and returns the
  // message every live rank reports.
  std::string DiagnoseSilentPeers();
  // Prints what failed and whom it waited for, then ends the process.
  [[noreturn]] void AbortOnDataPathFailure(const std::exception& e);
  // "rank(s) [..]" that asked for shutdown this cycle (a collective step).
  std::string RanksShuttingDown();

  std::unique_ptr<Context> ctx_;
  Controller controller_;
  Executor executor_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Work> queue_;            // guarded by mutex_
  Status broken_;                     // guarded by mutex_; set once the engine stops
  std::atomic<bool> shutdown_requested_{false};

  // Engine-thread state.
  std::unordered_map<std::string, Work> works_;  // offered, not yet run
  std::unique_ptr<Work> join_;   // this rank's join, until every rank joined
  int idle_cycles_ = 0;          // cycles in a row with nothing to do
  std::thread thread_;
};

}  // namespace ddl
