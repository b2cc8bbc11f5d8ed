#include "context.h"

#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace ddl {

namespace {

// Staging slot per rank and pipeline depth of the shared-memory allreduce:
// a chunk of 256 KB per rank keeps a 2-rank step inside one core's L2.
// Across nodes each chunk's slices also make one network exchange, whose
// round trips a larger chunk amortises: 1 MB there.
constexpr size_t kNodeChunkBytes = 256 * 1024;
constexpr size_t kCrossNodeChunkBytes = 1024 * 1024;
constexpr int kNodeSlots = 4;
}  // namespace

Status Context::ChooseAllreduce() {
  const AllreduceAlgorithm algo = config.allreduce;
  bool use_node_memory = false;
  if (algo == AllreduceAlgorithm::kHierarchical) {
    if (!homogeneous) {
      return Status::InvalidArgument(
          "DDL_ALLREDUCE=hierarchical needs the same number of ranks on every node, but local "
          "sizes differ; use DDL_ALLREDUCE=flat or auto" + Where());
    }
    use_node_memory = true;
  } else if (algo == AllreduceAlgorithm::kAuto) {
    // One node with several ranks: shared memory. Several nodes with
    // several ranks each: hierarchical. One rank per node or uneven nodes:
    // the flat ring over MPI.
    use_node_memory = local_size > 1 && homogeneous;
  }
  if (!use_node_memory) return Status::Ok();
  // Ranks grouped by DDL_LOCAL_SIZE must really share memory.
  MPI_Comm machine;
  MPI_Comm_split_type(local->comm(), MPI_COMM_TYPE_SHARED, local_rank, MPI_INFO_NULL, &machine);
  int machine_size = 0;
  MPI_Comm_size(machine, &machine_size);
  MPI_Comm_free(&machine);
  if (machine_size != local_size) {
    return Status::InvalidArgument(
        "the ranks of a node (DDL_LOCAL_SIZE=" + std::to_string(local_size) +
        ") do not all share memory on one machine; use a DDL_LOCAL_SIZE that divides the ranks "
        "per machine, or DDL_ALLREDUCE=flat" + Where());
  }
  // A name unique to this job (rank 0's pid and clock) and node (the world
  // rank of its local rank 0).
  std::vector<int64_t> token = world->AllgatherInt64(
      rank == 0 ? static_cast<int64_t>(getpid()) * 1000003 +
                      std::chrono::steady_clock::now().time_since_epoch().count() % 1000003
                : 0);
  std::vector<int64_t> node_id = local->AllgatherInt64(rank);
  try {
    node_memory = ShmArena::Create(*local, std::to_string(token[0]) + "." +
                                               std::to_string(node_id[0]),
                                   cross_size > 1 ? kCrossNodeChunkBytes : kNodeChunkBytes,
                                   kNodeSlots);
  } catch (const TransportError& e) {
    return Status::Internal(std::string(e.what()) + Where());
  }
  node_memory->SetPeerTimeout(config.peer_timeout_s);
  hierarchical = cross_size > 1;
  if (local_size > 1 && config.shm_pool_mb > 0) {
    try {
      output_pool = ShmPool::Create(
          *local, std::to_string(token[0]) + "." + std::to_string(node_id[0]) + ".outputs",
          static_cast<size_t>(config.shm_pool_mb * 1024 * 1024));
    } catch (const TransportError& e) {
      // Every local rank saw the same failure; the pool is only a shortcut.
      if (local_rank == 0) {
        std::fprintf(stderr, "[keras_ddl] warning: no shared-memory pool for allreduce results "
                     "(%s); results are copied out instead%s\n", e.what(), OnRank(rank).c_str());
      }
      output_pool = nullptr;
    }
  }
  return Status::Ok();
}

// Every rank parses its environment, then all learn whether any rank failed,
// so a bad value on one rank is an error everywhere instead of a hang in
// the next collective. The lowest failing rank's message is reported.
Status Context::AgreeOnConfig(Context* ctx) {
  Status mine = Config::FromEnvironment(&ctx->config);
  if (mine.ok() && ctx->rank == 0 && !ctx->config.timeline_path.empty()) {
    ctx->timeline = Timeline::Open(ctx->config.timeline_path, &mine);
  }
  if (mine.ok() && ctx->config.local_size > 0 && ctx->size % ctx->config.local_size != 0) {
    mine = Status::InvalidArgument(
        "environment variable DDL_LOCAL_SIZE=" + std::to_string(ctx->config.local_size) +
        " does not divide the world size " + std::to_string(ctx->size) +
        "; virtual nodes must all have the same number of ranks");
  }
  int failed_rank = mine.ok() ? ctx->size : ctx->rank;
  int first_failed = ctx->size;
  MPI_Allreduce(&failed_rank, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first_failed == ctx->size) return Status::Ok();
  std::vector<char> message(mine.message().begin(), mine.message().end());
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, first_failed, MPI_COMM_WORLD);
  message.resize(length);
  MPI_Bcast(message.data(), length, MPI_CHAR, first_failed, MPI_COMM_WORLD);
  return Status::InvalidArgument(std::string(message.begin(), message.end()) + " (on rank " +
                                 std::to_string(first_failed) + "; reported by rank " +
                                 std::to_string(ctx->rank) + ")");
}

std::string Context::Where() const {
  if (process_set == 0) return OnRank(world_rank);
  return " (rank " + std::to_string(world_rank) + ", process set " + std::to_string(process_set) +
         ")";
}

Status Context::CreateForGroup(MPI_Comm group, int process_set, const Config& config,
                               std::unique_ptr<Context>* out) {
  auto ctx = std::make_unique<Context>();
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx->world_rank);
  MPI_Comm_rank(group, &ctx->rank);
  MPI_Comm_size(group, &ctx->size);
  ctx->process_set = process_set;
  ctx->config = config;
  ctx->config.timeline_path.clear();  // the global context's timeline only
  Status s = ctx->Build(group);
  if (!s.ok()) return s;
  *out = std::move(ctx);
  return Status::Ok();
}

Status Context::Build(MPI_Comm base) {
  world = std::make_unique<MpiTransport>(base);

  // Nodes are cut by world rank, so a process set's node groups are the
  // job's nodes restricted to the set.
  MPI_Comm local_comm;
  if (config.local_size > 0) {
    MPI_Comm_split(base, world_rank / config.local_size, rank, &local_comm);
  } else {
    MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local_comm);
  }
  local = std::make_unique<MpiTransport>(local_comm);
  local_rank = local->rank();
  local_size = local->size();

  MPI_Comm cross_comm;
  MPI_Comm_split(base, local_rank, rank, &cross_comm);
  cross = std::make_unique<MpiTransport>(cross_comm);
  cross_rank = cross->rank();
  cross_size = cross->size();

  for (MpiTransport* t : {world.get(), local.get(), cross.get()}) {
    t->SetPeerTimeout(config.peer_timeout_s);
    t->SetSpinPolls(config.spin_polls);
  }
  std::vector<int64_t> local_sizes = world->AllgatherInt64(local_size);
  for (int64_t n : local_sizes) homogeneous &= (n == local_size);
  return ChooseAllreduce();
}

Status Context::Create(std::unique_ptr<Context>* out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::FailedPrecondition("MPI has already been finalized in this process");
  }
  int provided = 0;
  if (!initialized) {
    int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (code != MPI_SUCCESS) return Status::Internal("MPI_Init_thread failed: " + MpiErrorString(code));
  } else {
    MPI_Query_thread(&provided);
  }
  auto ctx = std::make_unique<Context>();
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ctx->size);
  if (provided < MPI_THREAD_MULTIPLE) {
    return Status::FailedPrecondition(
        "MPI was initialised with thread level " + std::to_string(provided) +
        " but keras_ddl needs MPI_THREAD_MULTIPLE; initialise MPI through keras_ddl.init() "
        "or mpi4py's default thread level" + OnRank(ctx->rank));
  }
  ctx->world_rank = ctx->rank;
  Status s = AgreeOnConfig(ctx.get());
  if (!s.ok()) return s;
  // Every collective call of the background thread goes through its own
  // duplicate, so user traffic on MPI_COMM_WORLD can never match ours.
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  s = ctx->Build(world);
  if (!s.ok()) return s;
  *out = std::move(ctx);
  return Status::Ok();
}

}  // namespace ddl
