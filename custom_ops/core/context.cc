#include "context.h"

#include <mpi.h>

#include <string>

namespace ddl {

namespace {
std::string OnRank(int rank) { return " (rank " + std::to_string(rank) + ")"; }
}  // namespace

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
  Status s = Config::FromEnvironment(&ctx->config);
  if (!s.ok()) return Status::InvalidArgument(s.message() + OnRank(ctx->rank));

  // Every collective call of the background thread goes through its own
  // duplicate, so user traffic on MPI_COMM_WORLD can never match ours.
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  ctx->world = std::make_unique<MpiTransport>(world);

  MPI_Comm local;
  if (ctx->config.local_size > 0) {
    if (ctx->size % ctx->config.local_size != 0) {
      return Status::InvalidArgument(
          "environment variable DDL_LOCAL_SIZE=" + std::to_string(ctx->config.local_size) +
          " does not divide the world size " + std::to_string(ctx->size) +
          "; virtual nodes must all have the same number of ranks" + OnRank(ctx->rank));
    }
    MPI_Comm_split(world, ctx->rank / ctx->config.local_size, ctx->rank, &local);
  } else {
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &local);
  }
  ctx->local = std::make_unique<MpiTransport>(local);
  ctx->local_rank = ctx->local->rank();
  ctx->local_size = ctx->local->size();

  MPI_Comm cross;
  MPI_Comm_split(world, ctx->local_rank, ctx->rank, &cross);
  ctx->cross = std::make_unique<MpiTransport>(cross);
  ctx->cross_rank = ctx->cross->rank();
  ctx->cross_size = ctx->cross->size();

  std::vector<int64_t> local_sizes = ctx->world->AllgatherInt64(ctx->local_size);
  for (int64_t n : local_sizes) ctx->homogeneous &= (n == ctx->local_size);
  *out = std::move(ctx);
  return Status::Ok();
}

}  // namespace ddl
