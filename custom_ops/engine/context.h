// Who this process is: its rank in the world, on its node, and across nodes,
// with one Group (transport and control plane) per group of ranks. Built
// from a world Group at init (MPI's, or threads as ranks in tests), and from
// a process set's Group; nothing here knows which transport it is.
#pragma once

#include <functional>
#include <memory>

#include "../algorithms/allreduce.h"
#include "../transport/group.h"
#include "../transport/node_agreement.h"
#include "../transport/shm_arena.h"
#include "../transport/shm_pool.h"
#include "../common/config.h"
#include "../health/fault_report.h"
#include "../health/liveness.h"
#include "thread_priority.h"
#include "timeline.h"
#include "../topology/topology.h"
#include "../common/types.h"

namespace ddl {

// Collective over `world`: every rank's outcome of a step that may fail on
// some ranks only. All return the lowest failing rank's error (naming
// that rank elsewhere), or all Ok: no rank goes on alone into the next
// collective while another has returned.
Status AgreeOnOutcome(ControlPlane& world, const Status& mine);

// Collective over `world`: compares every rank's Config::SharedSettings.
// A difference is InvalidArgument on every rank, naming each setting that
// differs and each rank's value.
Status CompareSharedSettings(const Config& mine, ControlPlane& world);

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
  // config's choice words, read by name (ReadChoices) by the layers that
  // act on them.
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kAuto;
  EnginePriority engine_priority = EnginePriority::kAuto;
  UplinkCompression uplink_compression = UplinkCompression::kNone;
  std::unique_ptr<Group> world;  // negotiation and flat algorithms
  std::unique_ptr<Group> local;  // ranks of this node
  std::unique_ptr<Group> cross;  // ranks with this local_rank on every node
  // The global context only: the same ranks as `world`, for the group
  // operations a caller's thread makes (add_process_set) while the engine
  // thread uses `world`.
  std::unique_ptr<Group> setup;
  // Racks, as the ranks agreed on them (topology.h).
  Topology topology;
  // With racks in use (DDL_ALLREDUCE=racks, or auto with several racks of
  // equal size): this local rank's column of nodes as the rack allreduce's
  // grid (algorithms/rack_allreduce.h): `rack_all` every node in rack-major
  // order, `rack_row` the nodes of this rack, `rack_column` the nodes at
  // this node's place in every rack. Null otherwise.
  std::unique_ptr<Group> rack_all, rack_row, rack_column;
  bool racks = false;
  // What the flat and cross-node steps may assume of the network
  // (topology/choose_allreduce.h): kUnknown with DDL_ALLREDUCE=auto when no
  // topology was given (or racks were given that the rack allreduce
  // cannot use), so large calls take the chain; kOneSwitch otherwise.
  NetworkShape network = NetworkShape::kOneSwitch;
  // Shared memory of this node's ranks; null when allreduce runs flat.
  std::unique_ptr<ShmArena> node_memory;
  bool hierarchical = false;  // node_memory plus a cross-node step
  // With node_memory on a single node of several ranks: `world` whose
  // bitwise AND (the negotiation's cached cycle) goes through the node's
  // shared memory. Null otherwise; NegotiationPlane() says which to use.
  std::unique_ptr<NodeAgreement> agreement;
  ControlPlane& NegotiationPlane() const {
    return agreement ? static_cast<ControlPlane&>(*agreement) : *world;
  }
  // Where allreduce results live with node_memory, several local ranks and
  // DDL_SHM_POOL_MB > 0; null otherwise. Shared: output tensors keep it
  // mapped after shutdown.
  std::shared_ptr<ShmPool> output_pool;
  std::unique_ptr<Timeline> timeline;  // rank 0 with DDL_TIMELINE set, else null
  // Every rank's host, pid and probe address (fault_report.h), learnt
  // while the context is built.
  PeerTable peers;
  // This rank's line on the process's activity board and the judge of its
  // groups' waits (liveness.h), from the peer table on; the engine marks
  // its collective steps in `activity`.
  std::shared_ptr<Activity> activity;
  std::unique_ptr<ProbeJudge> judge;
  // What a rank does once a peer is lost (Engine::OnPeerFailure): end its
  // process, so that no posted message writes into freed memory and the
  // launcher ends the job. The threads-as-ranks harness, whose ranks share
  // one process, turns it off: the engine then fails every work with the
  // report and stops.
  bool end_process_on_peer_failure = true;

  Context() = default;
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Where this rank reads DDL_TOPOLOGY and SLURM_TOPOLOGY_ADDR (topology.h):
  // the process environment, or on the threads-as-ranks harness each
  // thread-rank's own.
  using Environment = std::function<const char*(const char*)>;

  // Collective over `world` (taken over): reads the configuration, agrees
  // on it with every rank and splits the world into node and cross groups.
  // `racks_from`: see Environment (null: the process environment).
  static Status Create(std::unique_ptr<Group> world, std::unique_ptr<Context>* out,
                       Environment racks_from = nullptr);
  // A context over the ranks of `group` (taken over), with `config` already
  // agreed by every rank.
  static Status CreateForGroup(std::unique_ptr<Group> group, int process_set,
                               const Config& config, std::unique_ptr<Context>* out);

  // " (rank R)" or " (rank R, process set N)": appended to every message a
  // user may see, with R the rank in the whole job.
  std::string Where() const;

  // What large allreduces across nodes run, in words, and how to describe
  // the racks when nobody did: ddl.topology()'s description and schedule
  // and ddlrun --verbose's line. `schedule` gets "racks", "chain",
  // "pairwise" or "none" (one node).
  std::string DescribeNetwork(std::string* schedule = nullptr) const;

 private:
  // Splits `base` into node and cross groups and chooses the allreduce.
  Status Build(std::unique_ptr<Group> base);
  static Status AgreeOnConfig(Context* ctx, ControlPlane& world);
  // Reads config's choice words into the fields above; a word settings.def
  // lists but its layer does not know is an error on every rank.
  Status ReadChoices();
  // Sets up node_memory when DDL_ALLREDUCE and the nodes call for it
  // (UseNodeMemory, topology/choose_allreduce.h).
  Status SetUpNodeMemory();
  // Sets up `agreement` when every rank is on this node (after node_memory;
  // `token` names the job and node). Without it negotiation goes over MPI.
  void SetUpAgreement(const std::string& token);
  // Learns the racks (every rank of `world` agrees) and, when they are
  // used, splits the rack groups.
  Status LearnRacks();
  Environment racks_from_;
};

}  // namespace ddl
