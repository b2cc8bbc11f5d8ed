#include "runtime.h"

#include <algorithm>
#include <mutex>

#include "../transport/world.h"
#include "set_setup.h"

namespace ddl {

namespace {
std::mutex& RuntimeMutex() {
  static std::mutex m;
  return m;
}
// Index 0: the global engine; index k: process set k's (null where this
// rank is not a member).
std::vector<std::shared_ptr<Engine>>& Engines() {
  static std::vector<std::shared_ptr<Engine>> engines;
  return engines;
}
}  // namespace

Status Initialize() {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  if (!Engines().empty() && Engines()[0]) return Status::Ok();
  std::unique_ptr<Group> world;
  Status s = OpenWorld(&world);
  if (!s.ok()) return s;
  std::unique_ptr<Context> ctx;
  s = Context::Create(std::move(world), &ctx);
  if (!s.ok()) return s;
  Engines().assign(1, std::make_shared<Engine>(std::move(ctx)));
  return Status::Ok();
}

void Shutdown() {
  std::vector<std::shared_ptr<Engine>> engines;
  {
    std::lock_guard<std::mutex> lock(RuntimeMutex());
    engines.swap(Engines());
  }
  // The sets' engines first: each stops after a collective step of its own
  // members, which the global engine's shutdown does not wait for.
  for (size_t i = engines.size(); i-- > 0;) {
    if (engines[i]) engines[i]->Shutdown();
  }
}

std::shared_ptr<Engine> CurrentEngine() {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  return Engines().empty() ? nullptr : Engines()[0];
}

Status AddProcessSet(const std::vector<int>& ranks, int* id) {
  // One call at a time in this process: the rounds of two threads' calls
  // would otherwise interleave on the setup group.
  static std::mutex calls;
  // Why the setup group fell out of step, once a call failed that way.
  static std::string out_of_step_because;
  std::lock_guard<std::mutex> serial(calls);
  std::shared_ptr<Engine> global = CurrentEngine();
  if (!global) {
    return Status::FailedPrecondition("keras_ddl is not initialized: call keras_ddl.init() "
                                      "before add_process_set");
  }
  const Context& world = global->context();
  const std::string call = "add_process_set([" + RankList(ranks) + "]): ";
  if (!out_of_step_because.empty()) {
    return Status::FailedPrecondition(
        call + "refused: an earlier add_process_set failed with a rank not answering in time (" +
        out_of_step_because + "), so the ranks can no longer agree on new process sets in "
        "this job; end it and restart" + world.Where());
  }
  std::string problem;
  for (size_t i = 0; i < ranks.size() && problem.empty(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world.size) {
      problem = "rank " + std::to_string(ranks[i]) + " is outside [0, " +
                std::to_string(world.size) + ")";
    } else if (i > 0 && ranks[i] <= ranks[i - 1]) {
      problem = "the ranks must be sorted and distinct";
    }
  }
  if (ranks.empty()) problem = "a process set needs at least one rank";
  int next_id = 0;
  {
    std::lock_guard<std::mutex> lock(RuntimeMutex());
    next_id = static_cast<int>(Engines().size());
  }
  // Members build the set's context inside the agreement; its engine
  // starts only once every member has built one.
  std::unique_ptr<Context> ctx;
  auto build = [&](std::unique_ptr<Group> group) {
    return Context::CreateForGroup(std::move(group), next_id, world.config, &ctx);
  };
  bool out_of_step = false;
  Status s;
  try {
    s = SetUpProcessSet(*world.setup, ranks, problem, world.config.peer_timeout_s, build,
                        &out_of_step);
  } catch (const TransportError& e) {
    out_of_step = true;
    s = Status::Aborted(call + e.what());
  }
  if (out_of_step) out_of_step_because = s.message();
  if (!s.ok()) return Status(s.code(), s.message() + world.Where());
  std::shared_ptr<Engine> engine;
  if (ctx) engine = std::make_shared<Engine>(std::move(ctx));
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  *id = next_id;
  Engines().push_back(engine);
  return Status::Ok();
}

std::shared_ptr<Engine> EngineOf(int id, std::string* why) {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  if (Engines().empty() || !Engines()[0]) {
    *why = "keras_ddl is not initialized (or was shut down): call keras_ddl.init() first";
    return nullptr;
  }
  if (id < 0 || id >= static_cast<int>(Engines().size())) {
    *why = "process set " + std::to_string(id) + " does not exist" + Engines()[0]->context().Where();
    return nullptr;
  }
  if (!Engines()[id]) {
    *why = "this rank is not a member of process set " + std::to_string(id) +
           Engines()[0]->context().Where();
    return nullptr;
  }
  return Engines()[id];
}

void Submit(std::vector<Work> works, int set, bool drive) {
  std::string why;
  std::shared_ptr<Engine> engine = EngineOf(set, &why);
  if (!engine) {
    for (Work& w : works) {
      Finish(w, Status::FailedPrecondition("collective '" + w.name + "': " + why));
    }
    return;
  }
  if (drive) {
    engine->EnqueueAndDrive(std::move(works));
  } else {
    engine->Enqueue(std::move(works));
  }
}

std::string TransportLibraryVersion() { return WorldLibraryVersion(); }

}  // namespace ddl
