// Who this process is: its rank in the world, on its node, and across nodes,
// with one transport per group. Built once at init from MPI_COMM_WORLD.
#pragma once

#include <memory>

#include "../transport/mpi_transport.h"
#include "../transport/shm_arena.h"
#include "../transport/shm_pool.h"
#include "config.h"
#include "timeline.h"
#include "../common/types.h"

namespace ddl {

struct Context {
  int rank = 0;  // in this context's group: the world, or a process set
  int size = 1;
  int world_rank = 0;
  int process_set = 0;  // 0: every rank; otherwise the id AddProcessSet gave
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  bool homogeneous = true;  // every node has local_size ranks
  Config config;
  std::unique_ptr<MpiTransport> world;  // negotiation and flat algorithms
  std::unique_ptr<MpiTransport> local;  // ranks of this node
  std::unique_ptr<MpiTransport> cross;  // ranks with this local_rank on every node
  // Shared memory of this node's ranks; null when allreduce runs flat.
  std::unique_ptr<ShmArena> node_memory;
  bool hierarchical = false;  // node_memory plus a cross-node step
  // Where allreduce results live with node_memory, several local ranks and
  // DDL_SHM_POOL_MB > 0; null otherwise. Shared: output tensors keep it
  // mapped after shutdown.
  std::shared_ptr<ShmPool> output_pool;
  std::unique_ptr<Timeline> timeline;  // rank 0 with DDL_TIMELINE set, else null

  // Initialises MPI if nobody has (thread level MULTIPLE is required, as
  // Python may call MPI through mpi4py while the engine thread runs), reads
  // the configuration and splits the world into node and cross groups.
  static Status Create(std::unique_ptr<Context>* out);
  // A context over the ranks of `group` (a communicator this process is a
  // member of; taken over), with `config` already agreed by every rank.
  static Status CreateForGroup(MPI_Comm group, int process_set, const Config& config,
                               std::unique_ptr<Context>* out);

  // " (rank R)" or " (rank R, process set N)": appended to every message a
  // user may see, with R the rank in the whole job.
  std::string Where() const;

 private:
  // Splits `base` (a duplicate, owned from now on) into node and cross
  // groups and chooses the allreduce.
  Status Build(MPI_Comm base);
  static Status AgreeOnConfig(Context* ctx);
  // Applies DDL_ALLREDUCE to the topology; sets up node_memory if used.
  Status ChooseAllreduce();
};

}  // namespace ddl
