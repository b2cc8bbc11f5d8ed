// Who this process is: its rank in the world, on its node, and across nodes,
// with one Group (transport and control plane) per group of ranks. Built
// from a world Group at init (MPI's, or threads as ranks in tests), and from
// a process set's Group; nothing here knows which transport it is.
#pragma once

#include <memory>

#include "../transport/group.h"
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
  std::unique_ptr<Group> world;  // negotiation and flat algorithms
  std::unique_ptr<Group> local;  // ranks of this node
  std::unique_ptr<Group> cross;  // ranks with this local_rank on every node
  // The global context only: the same ranks as `world`, for the group
  // operations a caller's thread makes (add_process_set) while the engine
  // thread uses `world`.
  std::unique_ptr<Group> setup;
  // Shared memory of this node's ranks; null when allreduce runs flat.
  std::unique_ptr<ShmArena> node_memory;
  bool hierarchical = false;  // node_memory plus a cross-node step
  // Where allreduce results live with node_memory, several local ranks and
  // DDL_SHM_POOL_MB > 0; null otherwise. Shared: output tensors keep it
  // mapped after shutdown.
  std::shared_ptr<ShmPool> output_pool;
  std::unique_ptr<Timeline> timeline;  // rank 0 with DDL_TIMELINE set, else null

  // Collective over `world` (taken over): reads the configuration, agrees
  // on it with every rank and splits the world into node and cross groups.
  static Status Create(std::unique_ptr<Group> world, std::unique_ptr<Context>* out);
  // A context over the ranks of `group` (taken over), with `config` already
  // agreed by every rank.
  static Status CreateForGroup(std::unique_ptr<Group> group, int process_set,
                               const Config& config, std::unique_ptr<Context>* out);

  // " (rank R)" or " (rank R, process set N)": appended to every message a
  // user may see, with R the rank in the whole job.
  std::string Where() const;

 private:
  // Splits `base` into node and cross groups and chooses the allreduce.
  Status Build(std::unique_ptr<Group> base);
  static Status AgreeOnConfig(Context* ctx, ControlPlane& world);
  // Applies DDL_ALLREDUCE to the topology; sets up node_memory if used.
  Status ChooseAllreduce();
};

}  // namespace ddl
