#include "runtime.h"

#include <algorithm>
#include <mutex>

#include "../transport/mpi_world.h"

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
  Status s = OpenMpiWorld(&world);
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
  std::shared_ptr<Engine> global = CurrentEngine();
  if (!global) {
    return Status::FailedPrecondition("keras_ddl is not initialized: call keras_ddl.init() "
                                      "before add_process_set");
  }
  const Context& world = global->context();
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
  // Every rank must name the same set: compare a checksum of the list.
  uint64_t sum = ranks.size();
  for (int r : ranks) sum = sum * 1000003u + static_cast<uint64_t>(r) + 1;
  Group& setup = *world.setup;
  std::vector<int64_t> sums, bad;
  try {
    sums = setup.AllgatherInt64(static_cast<int64_t>(sum));
    bad = setup.AllgatherInt64(problem.empty() ? 0 : 1);
  } catch (const TransportError& e) {
    return Status::Aborted(std::string("add_process_set(ranks): ") + e.what() + world.Where());
  }
  const bool any_bad = std::count(bad.begin(), bad.end(), 1) > 0;
  const bool same = std::count(sums.begin(), sums.end(), sums[0]) == static_cast<long>(sums.size());
  if (!problem.empty()) {
    return Status::InvalidArgument("add_process_set(ranks): " + problem + world.Where());
  }
  if (any_bad) {
    return Status::InvalidArgument("add_process_set(ranks): another rank passed invalid ranks "
                                   "(see its error)" + world.Where());
  }
  if (!same) {
    return Status::InvalidArgument("add_process_set(ranks): the ranks differ between ranks of "
                                   "the job; every rank must pass the same list" + world.Where());
  }
  const bool member = std::binary_search(ranks.begin(), ranks.end(), world.world_rank);
  std::unique_ptr<Group> group;
  try {
    group = setup.Split(member ? 0 : -1, world.world_rank);
  } catch (const TransportError& e) {
    return Status::Aborted(std::string("add_process_set(ranks): ") + e.what() + world.Where());
  }
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(RuntimeMutex());
    *id = static_cast<int>(Engines().size());
  }
  if (member) {
    std::unique_ptr<Context> ctx;
    Status s = Context::CreateForGroup(std::move(group), *id, world.config, &ctx);
    if (!s.ok()) return s;
    engine = std::make_shared<Engine>(std::move(ctx));
  }
  std::lock_guard<std::mutex> lock(RuntimeMutex());
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

}  // namespace ddl
