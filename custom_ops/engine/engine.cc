#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "../negotiation/coordinator.h"
#include "thread_priority.h"

namespace ddl {

namespace {

std::atomic<bool> peer_failure_seen{false};

// Marks a cycle's collective steps in a rank's activity (null: none): the
// negotiation from construction, the data transfers from Next(), inside
// one until destroyed.
class ActivityStep {
 public:
  explicit ActivityStep(Activity* a) : a_(a) {
    if (a_ == nullptr) return;
    a_->step.fetch_add(1);
    a_->inside = true;
  }
  void Next() {
    if (a_ != nullptr) a_->step.fetch_add(1);
  }
  ~ActivityStep() {
    if (a_ != nullptr) a_->inside = false;
  }
  ActivityStep(const ActivityStep&) = delete;
  ActivityStep& operator=(const ActivityStep&) = delete;

 private:
  Activity* a_;
};

// The engine whose cycle this thread is running, if any.
thread_local const Engine* cycle_owner = nullptr;

// Makes `engine` this thread's cycle owner for a scope, then puts back the
// one before (not null: a scope may end inside another engine's cycle).
class CycleOwnerScope {
 public:
  explicit CycleOwnerScope(const Engine* engine) : previous_(cycle_owner) { cycle_owner = engine; }
  ~CycleOwnerScope() { cycle_owner = previous_; }
  CycleOwnerScope(const CycleOwnerScope&) = delete;
  CycleOwnerScope& operator=(const CycleOwnerScope&) = delete;

 private:
  const Engine* previous_;
};

// Checks an alltoall's splits against its rows and the world size, filling
// in the even split when none was given. Returns why they do not fit (""
// if they do); the caller offers that through negotiation, so every rank
// fails together.
std::string ResolveAlltoallSplits(Work& w, int size) {
  if (!w.invalid.empty() || w.shape.empty()) return w.invalid;  // scalar: Refusal's
  const int64_t rows = w.shape[0];
  if (w.splits.empty()) {
    if (rows % size != 0) {
      return "without splits the first dimension (" + std::to_string(rows) +
             ") must be divisible by the number of ranks (" + std::to_string(size) +
             "); pass splits= to send uneven parts";
    }
    w.splits.assign(size, rows / size);
    return "";
  }
  if (static_cast<int64_t>(w.splits.size()) != size) {
    return "splits has " + std::to_string(w.splits.size()) + " entries but there are " +
           std::to_string(size) + " ranks (one entry per rank)";
  }
  int64_t total = 0;
  for (size_t r = 0; r < w.splits.size(); ++r) {
    if (w.splits[r] < 0) {
      return "splits[" + std::to_string(r) + "] = " + std::to_string(w.splits[r]) +
             " is negative";
    }
    total += w.splits[r];
  }
  if (total != rows) {
    return "splits sum to " + std::to_string(total) + " but the tensor's first dimension is " +
           std::to_string(rows) + " (shape " + ShapeString(w.shape) + ")";
  }
  return "";
}

}  // namespace

bool Engine::PeerFailureSeen() { return peer_failure_seen.load(); }

// The failure policy, whatever the phase: a collective that fails halfway
// (no progress within DDL_PEER_TIMEOUT_S, or a transport error) leaves
// messages posted into buffers that will be freed (the framework's tensors
// in a data transfer, the negotiation's own vectors there) and ranks that
// no longer agree on what comes next. Nothing can be retried safely, so the
// rank probes every other rank (fault_report.h), prints the one diagnosis,
// and ends its process; the launcher then ends the job, and ddlrun
// --max-restarts can start it again from its last backup.
void Engine::OnPeerFailure(const std::exception& e, const char* phase) {
  peer_failure_seen = true;
  std::vector<int> awaited;
  if (auto* timeout = dynamic_cast<const PeerTimeout*>(&e)) awaited = timeout->unreachable();
  if (awaited.empty()) {
    for (const auto* t : {ctx_->world.get(), ctx_->local.get(), ctx_->cross.get(),
                          ctx_->rack_all.get(), ctx_->rack_row.get(), ctx_->rack_column.get()}) {
      if (t == nullptr) continue;
      for (int p : t->PendingPeers()) {
        if (std::find(awaited.begin(), awaited.end(), p) == awaited.end()) awaited.push_back(p);
      }
    }
  }
  std::sort(awaited.begin(), awaited.end());
  // At once: this node's ranks waiting on this one in shared memory learn
  // whom it lost, instead of timing out on it.
  if (ctx_->node_memory) ctx_->node_memory->PostFailureNote(awaited);
  if (ctx_->agreement) ctx_->agreement->memory().PostFailureNote(awaited);
  // The liveness judge probed every rank a moment ago when it gave up on
  // the wait: its states are the report's. Otherwise (a transport error)
  // probe now: a probe answers within milliseconds, a host behind a cut
  // link never does, so the patience bounds how long the report takes.
  std::vector<std::pair<int, PeerState>> states;
  if (!ctx_->judge || !ctx_->judge->RecentStates(&states)) {
    states = ctx_->peers.ProbeAll(ProbeJudge::Patience(ctx_->config.peer_timeout_s));
  }
  const std::string report = DescribeFault(ctx_->peers, phase, e.what(), awaited, states);
  if (!ctx_->end_process_on_peer_failure) {
    FailAll(Status::Aborted(report + ctx_->Where()));
    return;
  }
  // The pending works are never finished, so the framework keeps their
  // buffers alive while posted messages may still write into them.
  EndProcess(report, kDataPathFailureExitCode);
}

// Not a lost peer but a bug or a broken invariant in keras_ddl itself (an
// autotune table that does not parse, a logic error): said as such, on
// this rank. The process ends as after a lost peer, and for the same
// reason: this rank's part of the collective may have posted messages into
// buffers that are about to be freed, and the other ranks wait for it.
// They then find it gone and say so.
void Engine::OnInternalError(const std::exception& e, const char* phase) {
  const std::string report = std::string("internal error in ") + phase + ": " + e.what() +
                             ". This is a bug in keras_ddl, not a lost peer: please report it "
                             "with this line";
  if (ctx_->node_memory) ctx_->node_memory->PostFailureNote({});
  if (ctx_->agreement) ctx_->agreement->memory().PostFailureNote({});
  if (!ctx_->end_process_on_peer_failure) {
    FailAll(Status::Internal(report + ctx_->Where()));
    return;
  }
  EndProcess(report + "; ", kInternalErrorExitCode);
}

// Prints `report` (ending in its own separator) with what happens next,
// waits for the other ranks' reports, and ends the process with `code`.
void Engine::EndProcess(const std::string& report, int code) {
  std::fprintf(stderr,
               "[keras_ddl] %skeras_ddl ends this process now (exit code %d) so that the job "
               "ends instead of hanging%s\n",
               report.c_str(), code, ctx_->Where().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  AwaitOtherReports();
  std::_Exit(code);
}

// The launcher ends the whole job when one rank's process exits: mpiexec's
// proxy ends the other ranks of that host at once, the other hosts' ranks
// as soon as word reaches them. A rank that exits right after its own
// report would cut short the reports of the others, which lost progress
// at about the same time but hit their own timeouts a moment later (a
// node-mate still inside a data transfer when this one timed out in
// negotiation). So this rank first says on the probe channel that it ends
// (their judges then give up on it at once), and waits while any other
// rank still answers a probe without having said so. Ranks that are gone,
// stopped or cut off are not waited for. The bound is what another rank
// may take to report: its own timeout, from a last progress no later than
// now, then its judge's two probes and window, plus a margin.
void Engine::AwaitOtherReports() {
  ActivityBoard::Get().MarkEnding();
  const double timeout = ctx_->config.peer_timeout_s;
  const double patience = ProbeJudge::Patience(timeout);
  const double bound = timeout > 0 ? timeout + 2 * patience + 1 + 3 : 10;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(bound);
  while (std::chrono::steady_clock::now() < until) {
    bool waiting = false;
    for (const PeerView& v : ctx_->peers.Survey(patience, 0)) {
      waiting = waiting || (v.state == PeerState::kAlive && !v.ending);
    }
    if (!waiting) return;
    // A probe costs the peer a connection and a line: a few per second.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Engine::Engine(std::unique_ptr<Context> ctx)
    : ctx_(std::move(ctx)),
      controller_(ctx_->NegotiationPlane(), ctx_->config),
      executor_(*ctx_) {
  thread_ = std::thread(&Engine::Loop, this);
}

Engine::~Engine() { Shutdown(); }

Status Engine::Validate(const Work& w) const {
  const std::string where = " for tensor '" + w.name + "'" + ctx_->Where();
  if (w.name.empty()) return Status::InvalidArgument("collective without a name" + where);
  for (int64_t d : w.shape) {
    if (d < 0) return Status::InvalidArgument("negative dimension in shape " + ShapeString(w.shape) + where);
  }
  // Checks of arguments that could differ between ranks (dtype against op,
  // scalar reducescatter, root range) are the coordinator's: refusing them
  // here would fail this rank alone while the others wait for it.
  return Status::Ok();
}

std::vector<std::pair<Work, Status>> Engine::Queue(std::vector<Work> works) {
  std::vector<std::pair<Work, Status>> rejected;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  for (Work& w : works) {
    w.enqueued = now;
    Status s = broken_.ok() ? Validate(w) : broken_;
    if (s.ok()) {
      queue_.push_back(std::move(w));
      queued_.store(queue_.size(), std::memory_order_release);
    } else {
      rejected.emplace_back(std::move(w), s);
    }
  }
  return rejected;
}

void Engine::Enqueue(std::vector<Work> works) {
  auto rejected = Queue(std::move(works));
  // All: a driving caller may be waiting between its rounds as well.
  wake_.notify_all();
  for (auto& [w, reason] : rejected) Finish(w, reason);
}

bool Engine::OnCycleThread() const { return cycle_owner == this; }

void Engine::EnqueueAndDrive(std::vector<Work> works) {
  // A kernel run inline by a done callback inside a cycle is on the thread
  // that holds the cycle: it can only queue. For this engine's own cycle,
  // try_lock on a mutex this thread owns would be undefined; for another
  // engine's (another process set), driving here would hold that cycle
  // until this engine's ranks meet, and their own cycles may wait for it.
  if (cycle_owner != nullptr) {
    Enqueue(std::move(works));
    return;
  }
  std::unique_lock<std::mutex> cycle(cycle_mutex_, std::try_to_lock);
  // The engine thread may be finishing the cycle that completed this
  // caller's previous op (it called done first, then its bookkeeping).
  // Waiting a little for that tail keeps a loop of eager calls on the
  // caller's thread; without it the engine kept every call of such a loop
  // once it had one. A cycle still running after that is a round that
  // waits for other ranks: then the work is queued for it.
  const auto patience = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  while (!cycle.owns_lock() && std::chrono::steady_clock::now() < patience) {
    std::this_thread::yield();
    cycle.try_lock();
  }
  if (!cycle.owns_lock() || stopped_) {
    // A cycle is running (the engine thread's, or another caller's): it or
    // the next one takes these works, as for any enqueue.
    if (cycle.owns_lock()) cycle.unlock();
    Enqueue(std::move(works));
    return;
  }
  // Counts this call's works still running; each one's done callback
  // finishes it. All of them run in cycles this thread runs, since it
  // holds cycle_mutex_ until they are done.
  auto running = std::make_shared<std::atomic<size_t>>(works.size());
  for (Work& w : works) {
    w.done = [running, done = std::move(w.done)](const Status& s) {
      --*running;
      if (done) done(s);
    };
  }
  for (auto& [w, reason] : Queue(std::move(works))) Finish(w, reason);
  cycle_on_caller_ = true;
  CycleOwnerScope owner(this);
  while (*running > 0 && !stopped_) {
    const auto start = std::chrono::steady_clock::now();
    if (!GuardedCycle()) {
      Stop();
      break;
    }
    if (*running == 0) break;
    // Not done yet: some rank has not offered these names. Like the
    // engine thread, meet the others again a cycle after this one began,
    // or at once when more work arrives, rather than in a loop of rounds
    // that would keep every rank's core busy until the stall timeout.
    // The cycle time is the one in force (DDL_AUTOTUNE may change it).
    const auto cycle_time = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double, std::milli>(executor_.settings().cycle_time_ms));
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_until(lock, start + cycle_time,
                     [&] { return !queue_.empty() || shutdown_requested_; });
  }
  cycle_on_caller_ = false;
}

void Engine::Stop() {
  {
    // Under mutex_, so the engine thread cannot miss the notification
    // between testing its wait's condition and sleeping.
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  wake_.notify_all();
}

std::string Engine::RanksShuttingDown() {
  // Every rank saw the shutdown flag in the same cycle, so all take part
  // in this one extra exchange.
  try {
    return controller_.RanksShuttingDown(shutdown_requested_);
  } catch (const TransportError& e) {
    OnPeerFailure(e, "the shutdown exchange");
    return "a rank that was lost";
  }
}

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_requested_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::FailAll(const Status& status) {
  std::deque<Work> queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.ok()) broken_ = status;
    queued.swap(queue_);
    queued_ = 0;
  }
  // Works the cycle took are failed too: a done callback that is never
  // called leaves an eager op waiting forever. Finish is a no-op for the
  // ones already finished.
  for (Work& w : arrived_) Finish(w, status);
  arrived_.clear();
  for (auto& [name, w] : works_) Finish(w, status);
  works_.clear();
  for (Work& w : runnable_) Finish(w, status);
  runnable_.clear();
  if (join_) Finish(*join_, status);
  join_.reset();
  controller_.SetJoined(false);
  controller_.DropAll();
  for (Work& w : queued) Finish(w, status);
}

Work Engine::StandIn(const Request& r) {
  Work w = WorkOf(r);
  // An allgather gets no rows from a joined rank (a scalar's one row too).
  if (w.collective == Collective::kAllgather) {
    if (w.shape.empty()) w.shape = {0};
    w.shape[0] = 0;
  }
  const size_t elem = DataTypeSize(w.dtype);
  auto input = std::make_shared<std::vector<char>>(
      std::max<size_t>(NumElements(w.shape) * elem, 1), 0);
  auto output = std::make_shared<std::vector<char>>(input->size());
  w.input = input->data();
  if (w.collective == Collective::kBroadcast) w.output = output->data();
  w.allocate = [output, elem](const std::vector<int64_t>& shape, void** data) {
    output->resize(std::max<size_t>(NumElements(shape) * elem, 1));
    *data = output->data();
    return Status::Ok();
  };
  w.done = [input, output](const Status&) {};
  return w;
}

void Engine::Admit(Work& work) {
  if (work.collective == Collective::kJoin) {
    if (join_) {
      Finish(work, Status::InvalidArgument("join called while this rank's earlier join has not "
                                           "returned" + ctx_->Where()));
      return;
    }
    join_ = std::make_unique<Work>(std::move(work));
    controller_.SetJoined(true);
    return;
  }
  work.wire = WireDtype(work);
  if (work.collective == Collective::kAlltoall) {
    work.invalid = ResolveAlltoallSplits(work, ctx_->size);
  }
  if (!controller_.Offer(RequestOf(work, ctx_->rank))) {
    Finish(work, Status::InvalidArgument(
        "a collective named '" + work.name + "' is already in flight" + ctx_->Where() +
        "; concurrent collectives need distinct names"));
    return;
  }
  std::string name = work.name;
  works_.emplace(std::move(name), std::move(work));
}

void Engine::Loop() {
  // Across nodes a transfer needs the engine's polls while the backward
  // pass keeps the core busy; inside one node the peers write shared
  // memory directly, and prompt wakes only cost the compute context
  // switches (docs/PERFORMANCE.md, "Engine thread priority").
  EnginePriority priority = ctx_->engine_priority;
  if (priority == EnginePriority::kAuto) {
    priority = ctx_->size > ctx_->local_size ? EnginePriority::kHigh : EnginePriority::kNormal;
  }
  ClaimEngineThread(priority);
  bool ran_here = false;  // this thread's last cycle ran works
  while (!stopped_) {
    if (ran_here) AwaitNextWork();
    ran_here = false;
    // An engine with nothing to do doubles its wait each idle cycle, up to
    // 2^kMaxIdleDoublings cycles: while the model computes, ranks meet a
    // few times per step instead of every cycle, which on a core shared
    // with TensorFlow's threads is a few percent of the step. Work still
    // starts a cycle at once (the first rank to have work then waits
    // inside the negotiation for the others), so this adds no latency;
    // only stall reports wait longer.
    constexpr int kMaxIdleDoublings = 4;
    const auto cycle = std::chrono::duration<double, std::milli>(
        executor_.settings().cycle_time_ms *
        (1 << std::min(idle_cycles_.load(), kMaxIdleDoublings)));
    const uint64_t cycles_before = cycles_run_.load();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::duration_cast<std::chrono::nanoseconds>(cycle),
                     [&] { return !queue_.empty() || shutdown_requested_ || stopped_; });
    }
    // The queue is taken inside the cycle, under cycle_mutex_: works a
    // driving caller queued are then never held here while it cycles.
    std::lock_guard<std::mutex> running(cycle_mutex_);
    if (stopped_) break;
    // A driving caller's cycles count as this thread's: with nothing new
    // queued, the next cycle here is due a whole cycle after them.
    // (Otherwise this rank would open an idle round at a moment of its
    // own, right after a call, and the next call would find the cycle taken
    // while that round waits for the other ranks to meet it.)
    if (cycles_run_.load() != cycles_before && !shutdown_requested_) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty()) continue;
    }
    CycleOwnerScope owner(this);
    if (!GuardedCycle()) Stop();
    ran_here = last_cycle_ran_;
  }
}

// In a chain of dependent ops (a tf.function's), each op's done callback,
// run by this thread, lets TensorFlow's executor start the next op on one
// of its threads, which enqueues it some microseconds later. Asleep on
// wake_, this thread would need a futex wake for each op (and the ranks'
// engine threads wake at moments of their own); polling a moment instead
// takes the op at once. Yields, not naps: TensorFlow's thread may need
// this core. A model's gradients arrive the same way, so this costs a
// poll after their cycles; an eager call's cycle runs on its caller, and
// the engine thread then does not poll.
void Engine::AwaitNextWork() {
  constexpr int kSpinPolls = 100;
  constexpr auto kWatch = std::chrono::microseconds(100);
  const auto until = std::chrono::steady_clock::now() + kWatch;
  for (int polls = 0; queued_.load(std::memory_order_acquire) == 0; ++polls) {
    if (shutdown_requested_ || stopped_) return;
    if (polls >= kSpinPolls) {
      if (std::chrono::steady_clock::now() >= until) return;
      std::this_thread::yield();
    }
  }
  ++polled_takes_;
}

bool Engine::GuardedCycle() {
  try {
    return RunCycle();
  } catch (const std::exception& e) {
    // A transport error outside the guarded phases, or a throw of a done
    // callback or of the engine's own bookkeeping: only the first may
    // mean a lost rank.
    const bool transport = dynamic_cast<const TransportError*>(&e) != nullptr;
    if (dynamic_cast<const PeerTimeout*>(&e)) peer_failure_seen = true;
    std::string message = transport ? std::string("keras_ddl communication failed: ") + e.what() +
                                          "; a rank may have died" + ctx_->Where()
                                    : std::string("keras_ddl failed inside a cycle: ") + e.what() +
                                          ctx_->Where();
    std::fprintf(stderr, "[keras_ddl] %s\n", message.c_str());
    std::fflush(stderr);
    FailAll(Status::Aborted(message));
    return false;
  }
}

bool Engine::RunCycle() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    arrived_.swap(queue_);
    queued_ = 0;
  }
  const bool had_arrivals = !arrived_.empty();
  // Each work leaves arrived_ only once Admit has put it in works_ or
  // finished it.
  while (!arrived_.empty()) {
    Admit(arrived_.front());
    arrived_.pop_front();
  }

  Negotiated outcome;
  // Every rank of the set enters the same steps: a peer's judge compares
  // its own step with this one's (liveness.h).
  ActivityStep step(ctx_->activity.get());
  try {
    outcome = controller_.Negotiate(shutdown_requested_);
  } catch (const TransportError& e) {
    // Its collective is still posted, into vectors that are gone now.
    OnPeerFailure(e, "negotiation");
    return false;
  }
  step.Next();
  // What runs is taken before the refused are finished: a done callback
  // may throw, and FailAll then reaches the taken works in runnable_.
  for (const std::string& name : outcome.run) {
    auto it = works_.find(name);
    if (it == works_.end()) {
      runnable_.push_back(StandIn(outcome.stand_ins.at(name)));
      continue;
    }
    runnable_.push_back(std::move(it->second));
    works_.erase(it);
  }
  for (const auto& [name, message] : outcome.refused) {
    auto it = works_.find(name);
    if (it == works_.end()) continue;
    Work refused = std::move(it->second);
    works_.erase(it);
    Finish(refused, IsMismatch(message) ? Status::FailedPrecondition(message + ctx_->Where())
                                        : Status::InvalidArgument(message + ctx_->Where()));
  }
  if (ctx_->timeline) {
    const auto now = std::chrono::steady_clock::now();
    // "caller": the cycle ran on the thread of an eager op that drove it.
    const std::string args = cycle_on_caller_ ? "\"cycle\": \"caller\"" : "";
    for (const Work& w : runnable_) {
      ctx_->timeline->Span(w.name, "NEGOTIATE", w.enqueued, now, args);
    }
  }
  try {
    executor_.Run(runnable_, outcome.active);
  } catch (const TransportError& e) {
    OnPeerFailure(e, "a data transfer");
    return false;
  } catch (const std::exception& e) {
    OnInternalError(e, "a data transfer");
    return false;
  }
  const bool ran_any = !runnable_.empty();
  last_cycle_ran_ = ran_any;
  runnable_.clear();
  const bool idle = !had_arrivals && !ran_any && works_.empty() && !join_ &&
                    !outcome.exchanged;
  idle_cycles_ = idle ? idle_cycles_ + 1 : 0;
  ++cycles_run_;
  if (outcome.all_joined && join_) {
    *static_cast<int32_t*>(join_->output) = outcome.last_joined;
    Finish(*join_, Status::Ok());
    join_.reset();
    controller_.SetJoined(false);
  }

  if (!outcome.fatal.empty()) {
    FailAll(Status::DeadlineExceeded("keras_ddl aborted the job: " + outcome.fatal + ctx_->Where()));
    return false;
  }
  if (outcome.shutdown) {
    FailAll(Status::Aborted("keras_ddl has been shut down on " + RanksShuttingDown() +
                            ": a collective cannot run after ddl.shutdown() or once any rank "
                            "has shut down (an uncaught exception or exit ends keras_ddl on "
                            "its rank)" + ctx_->Where()));
    return false;
  }
  return true;
}

}  // namespace ddl
