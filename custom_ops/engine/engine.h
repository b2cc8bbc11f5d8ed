// The background engine: kernels enqueue Work and return, and cycles of
// negotiation run one at a time. In each cycle every rank reports what
// became ready; the coordinator (rank 0) answers with the names ready
// everywhere, in one order, and every rank then executes that list. Agreed
// names enter the response cache, after which a cycle costs one small
// bitwise-AND allreduce. The engine thread runs the cycles, except that an
// eager op, whose caller waits for it anyway, runs them on its own thread
// when no cycle is running (EnqueueAndDrive).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "context.h"
#include "../negotiation/controller.h"
#include "executor.h"
#include "../negotiation/message.h"
#include "work.h"

namespace ddl {

// Exit code of a process that keras_ddl ended after a failed collective
// (in negotiation or in a data transfer alike).
constexpr int kDataPathFailureExitCode = 70;
// Exit code of a process that keras_ddl ended after an internal error (a
// bug in keras_ddl, not a lost peer) in a collective.
constexpr int kInternalErrorExitCode = 71;

class Engine {
 public:
  explicit Engine(std::unique_ptr<Context> ctx);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Context& context() const { return *ctx_; }
  const TrafficCounters& traffic() const { return executor_.traffic(); }
  // The fusion threshold and cycle time in force (DDL_AUTOTUNE may change them).
  AutotuneSetting settings() const { return executor_.settings(); }

  // Hands the works to the engine as one unit (they enter the same cycle).
  // Invalid works fail through their done callback before this returns.
  void Enqueue(std::vector<Work> works);

  // Like Enqueue, for a caller that blocks until the works are done anyway
  // (an eager op): when no cycle is running, the calling thread runs the
  // cycles itself until its works are done, and their done callbacks run
  // before this returns. That saves waking the engine thread and being
  // woken by it, tens of microseconds per call. Otherwise it is Enqueue.
  void EnqueueAndDrive(std::vector<Work> works);

  // Works the engine thread took by polling right after a cycle that ran
  // works (AwaitNextWork), without being woken.
  uint64_t polled_takes() const { return polled_takes_.load(); }

  // True on the thread running one of this engine's cycles, while it runs it
  // (the engine thread, or a driving caller between and during its cycles).
  bool OnCycleThread() const;

  // Asks every rank's engine to stop after the current cycle and waits for
  // this rank's thread. In-flight works fail with an Aborted status.
  void Shutdown();

  // True once any engine in this process stopped because a peer went
  // silent (died or hung); the process should then end the whole job.
  static bool PeerFailureSeen();

 private:
  void Loop();
  // After the engine thread ran works: polls queued_ for a moment (spins,
  // then yields, never sleeps), as the next op of a chain arrives then.
  void AwaitNextWork();
  // Queues the valid works (without waking the engine thread); returns the
  // invalid ones, with their reasons, for the caller to finish.
  std::vector<std::pair<Work, Status>> Queue(std::vector<Work> works);
  // One cycle on whichever thread holds cycle_mutex_: admits what was
  // queued, negotiates, runs what is ready everywhere. Returns false when
  // the engine must stop (it has failed every work then).
  bool RunCycle();
  // RunCycle, turning an escaped exception into failed works and false.
  bool GuardedCycle();
  // After a cycle returned false: no thread runs another one.
  void Stop();
  Status Validate(const Work& work) const;
  // Moves `work` into the cycle's offers (or finishes it with its error).
  void Admit(Work& work);
  // This rank's part in a collective it runs while joined: zeros in, the
  // result discarded; the memory lives as long as the work.
  static Work StandIn(const Request& request);
  void FailAll(const Status& status);
  // After a transport failure or timeout in `phase`: probes every rank,
  // prints the one diagnosis (fault_report.h), then ends the process.
  // Returns only where the context keeps the process (the harness): every
  // work has then failed with the report, and no cycle may run again.
  void OnPeerFailure(const std::exception& e, const char* phase);
  // After an exception that is no transport's in `phase`: says it is an
  // internal error (not a lost peer), then ends the process as above.
  void OnInternalError(const std::exception& e, const char* phase);
  // Before a rank that reported ends its process: waits until every other
  // rank that still answers a probe has reported too, or a bound passes
  // (see engine.cc).
  void AwaitOtherReports();
  // The report line, the wait above, then _Exit(code); never returns.
  [[noreturn]] void EndProcess(const std::string& report, int code);
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
  // Held while a cycle runs, by the engine thread or by a driving caller:
  // cycles of one engine never overlap, whoever runs them.
  std::mutex cycle_mutex_;
  std::atomic<bool> stopped_{false};  // a cycle returned false: no more cycles
  std::atomic<uint64_t> cycles_run_{0};  // cycles completed, by either thread

  // Cycle state: touched only under cycle_mutex_.
  bool cycle_on_caller_ = false;  // this cycle runs on a driving caller's thread
  // Every work a cycle has taken from queue_ is in exactly one of these
  // until it is finished, so FailAll reaches it whatever throws.
  std::deque<Work> arrived_;     // taken from queue_, not yet admitted
  std::unordered_map<std::string, Work> works_;  // offered, not yet run
  std::vector<Work> runnable_;   // agreed this cycle, running
  std::unique_ptr<Work> join_;   // this rank's join, until every rank joined
  std::atomic<int> idle_cycles_{0};  // cycles in a row with nothing to do
  // queue_'s length, for the engine thread's brief poll (AwaitNextWork)
  // without taking mutex_.
  std::atomic<size_t> queued_{0};
  std::atomic<uint64_t> polled_takes_{0};
  bool last_cycle_ran_ = false;  // under cycle_mutex_: the cycle ran works
  std::thread thread_;
};

}  // namespace ddl
