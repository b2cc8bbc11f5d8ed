#include "runtime.h"

#include <mpi.h>

#include <algorithm>
#include <mutex>

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
  std::unique_ptr<Context> ctx;
  Status s = Context::Create(&ctx);
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
  uint64_t low = sum, high = sum;
  int bad = problem.empty() ? 0 : 1, any_bad = 0;
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!problem.empty()) {
    return Status::InvalidArgument("add_process_set(ranks): " + problem + world.Where());
  }
  if (any_bad) {
    return Status::InvalidArgument("add_process_set(ranks): another rank passed invalid ranks "
                                   "(see its error)" + world.Where());
  }
  if (low != high) {
    return Status::InvalidArgument("add_process_set(ranks): the ranks differ between ranks of "
                                   "the job; every rank must pass the same list" + world.Where());
  }
  const bool member = std::binary_search(ranks.begin(), ranks.end(), world.world_rank);
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, world.world_rank, &group);
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(RuntimeMutex());
    *id = static_cast<int>(Engines().size());
  }
  if (member) {
    std::unique_ptr<Context> ctx;
    Status s = Context::CreateForGroup(group, *id, world.config, &ctx);
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
