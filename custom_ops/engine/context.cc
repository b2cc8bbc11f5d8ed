#include "context.h"

#include "../topology/topology_probe.h"

#include "../common/util.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
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
// With racks each chunk's slices go through the rack allreduce's pipeline
// (pieces of an eighth of a slice): larger chunks keep its fill and drain
// a small part of each.
constexpr size_t kRackChunkBytes = 4 * 1024 * 1024;

// Root's view of every rank's shared settings (EncodeSharedValues'
// bytes): "" when they agree, else one clause per setting that differs,
// naming each value and its ranks, and one per rank whose bytes do not
// decode (DecodeSharedValues names what was wrong).
std::string DescribeDifferences(const std::vector<std::string>& names,
                                const std::vector<std::vector<char>>& per_rank) {
  std::vector<std::vector<std::string>> values(per_rank.size());
  std::string unreadable;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const Status s = DecodeSharedValues(per_rank[r], names.size(), &values[r]);
    if (!s.ok()) {
      unreadable += (unreadable.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                    " sent " + s.message();
    }
    values[r].resize(names.size());
  }
  if (!unreadable.empty()) return unreadable;
  std::string problems;
  for (size_t s = 0; s < names.size(); ++s) {
    // Values in order of first appearance, each with the ranks holding it.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (size_t r = 0; r < values.size(); ++r) {
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == values[r][s]; });
      if (it == groups.end()) it = groups.insert(groups.end(), {values[r][s], {}});
      it->second.push_back(static_cast<int>(r));
    }
    if (groups.size() < 2) continue;
    std::string clause = names[s] + " differs between ranks: ";
    for (size_t g = 0; g < groups.size(); ++g) {
      clause += (g ? ", " : "") + std::string(groups[g].second.size() > 1 ? "ranks " : "rank ") +
                RankRuns(groups[g].second) + ": " + groups[g].first;
    }
    problems += (problems.empty() ? "" : "; ") + clause;
  }
  return problems;
}

std::string Number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

// The smallest staging slot DDL_SHM_ARENA_MB may bring the arena to.
constexpr size_t kMinSlotBytes = 64 * 1024;

}  // namespace

Status AgreeOnOutcome(ControlPlane& world, const Status& mine) {
  // Every rank learns which ranks failed; the lowest one's error (its code
  // as the first byte) goes to every rank, so all return the same error
  // together instead of some waiting for the others in the next step.
  const std::vector<int64_t> failed = world.AllgatherInt64(mine.ok() ? 0 : 1);
  const int first = static_cast<int>(std::find(failed.begin(), failed.end(), 1) - failed.begin());
  if (first == world.size()) return Status::Ok();
  std::vector<char> message;
  if (world.rank() == first) {
    message.push_back(static_cast<char>(mine.code()));
    message.insert(message.end(), mine.message().begin(), mine.message().end());
  }
  world.BroadcastBytes(message, first);
  if (message.empty()) return Status::Internal("an empty error from rank " + std::to_string(first));
  const int me = world.WorldRank(world.rank());
  const int them = world.WorldRank(first);
  std::string text(message.begin() + 1, message.end());
  if (them != me) text += " (on rank " + std::to_string(them) + "; reported by rank " +
                          std::to_string(me) + ")";
  return Status(static_cast<Status::Code>(message[0]), text);
}

Status Context::LearnRacks() {
  // The node's id: the job-wide rank of its local rank 0.
  const int64_t node_id = local->AllgatherInt64(world_rank)[0];
  const Environment process = [](const char* n) -> const char* { return std::getenv(n); };
  const RackPlace mine = DetectRack(racks_from_ ? racks_from_ : process, HostName());
  Status s = AgreeOnTopology(*world, mine, node_id, &topology);
  if (!s.ok()) return Status::InvalidArgument(s.message() + Where());
  // With nothing told, the job probes too when the answer matters: with 3
  // or more nodes a network of racks wants the rack allreduce or the
  // chain, one switch the pairwise schedule. Nodes that DDL_LOCAL_SIZE
  // cut from one machine share no network to measure, so any two nodes on
  // one host keep the chain without probing. Every rank decides alike from
  // the same topology.
  const int node_count = static_cast<int>(topology.rack_of_node.size());
  std::vector<std::string> hosts = topology.host_of_node;
  std::sort(hosts.begin(), hosts.end());
  const bool own_hosts = std::adjacent_find(hosts.begin(), hosts.end()) == hosts.end();
  const bool by_default =
      topology.source.empty() && node_count >= 3 && own_hosts && process_set == 0;
  if (topology.source == "probe" || by_default) {
    // Measured by the whole job once; a process set takes the chain, as a
    // network nobody described (docs/untold_network.md).
    ProbeVerdict verdict;
    verdict.reason = "a process set does not probe";
    if (process_set == 0) {
      std::vector<int> first_rank_of_node(node_count, -1);
      for (int r = static_cast<int>(topology.node_of_rank.size()) - 1; r >= 0; --r) {
        first_rank_of_node[topology.node_of_rank[r]] = r;
      }
      // Asked for, the table is printed; by default only for ddlrun --verbose.
      verdict = ProbeRacks(*world, local_rank == 0 ? cross.get() : nullptr, first_rank_of_node,
                           !by_default || config.print_topology == 1);
    }
    ApplyProbeVerdict(verdict, &topology);
    topology.probed_by_default = by_default;
  }
  const int num_racks = topology.num_racks();
  const bool even = topology.nodes_per_rack > 0 && homogeneous;
  if (allreduce == AllreduceAlgorithm::kRacks && !even) {
    return Status::InvalidArgument(
        "DDL_ALLREDUCE=racks needs as many nodes in every rack and as many ranks on every node; "
        "the job has " + topology.Describe() + (homogeneous ? "" : ", with uneven nodes") +
        "; use DDL_ALLREDUCE=auto" + Where());
  }
  // Every rank reaches the same `racks` and `network` from the same
  // topology (topology/choose_allreduce.h says why).
  racks = UseRacks(allreduce, even, num_racks);
  network = ShapeOfNetwork(allreduce, racks, topology.untold(), num_racks);
  if (!racks) return Status::Ok();
  const int my_node = topology.node_of_rank[rank];
  const int my_rack = topology.rack_of_rank[rank];
  int place = 0;  // this node's index among its rack's nodes
  for (int n = 0; n < my_node; ++n) place += topology.rack_of_node[n] == my_rack;
  const int nodes = topology.nodes_per_rack;
  rack_all = world->Split(local_rank, my_rack * static_cast<int>(topology.rack_of_node.size()) + my_node);
  rack_row = world->Split(local_rank * num_racks + my_rack, place);
  rack_column = world->Split(local_rank * nodes + place, my_rack);
  for (Group* g : {rack_all.get(), rack_row.get(), rack_column.get()}) {
    g->SetPeerTimeout(config.peer_timeout_s);
    g->SetSpinPolls(config.spin_polls);
    g->SetLiveness(judge.get());
  }
  return Status::Ok();
}

Status CompareSharedSettings(const Config& mine, ControlPlane& world) {
  const auto settings = mine.SharedSettings();
  std::vector<std::string> names;
  for (const auto& [name, value] : settings) names.push_back(name);
  const std::vector<char> values = EncodeSharedValues(settings);
  // Rank 0 compares and tells everyone, so all ranks fail with one message.
  const auto all = world.GatherBytes(values, 0);
  std::string verdict = world.rank() == 0 ? DescribeDifferences(names, all) : "";
  std::vector<char> message(verdict.begin(), verdict.end());
  world.BroadcastBytes(message, 0);
  if (message.empty()) return Status::Ok();
  return Status::InvalidArgument(
      std::string(message.begin(), message.end()) +
      ". Every rank must use the same value of these settings (they decide what goes on the "
      "wire); set them identically in every rank's environment" + OnRank(world.WorldRank(world.rank())));
}

Status Context::ReadChoices() {
  std::string unknown;
  if (!AllreduceAlgorithmNamed(config.allreduce, &allreduce)) {
    unknown = "DDL_ALLREDUCE=" + config.allreduce + " (topology/choose_allreduce.cc)";
  } else if (!EnginePriorityNamed(config.engine_priority, &engine_priority)) {
    unknown = "DDL_ENGINE_PRIORITY=" + config.engine_priority + " (engine/thread_priority.cc)";
  } else if (!UplinkCompressionNamed(config.uplink_compression, &uplink_compression)) {
    unknown = "DDL_UPLINK_COMPRESSION=" + config.uplink_compression +
              " (topology/choose_allreduce.cc)";
  }
  // DDL_ENGINE_PRIORITY may differ per rank: agreed, so no rank goes on alone.
  return AgreeOnOutcome(*world, unknown.empty() ? Status::Ok() : Status::Internal(
      "keras_ddl was built with a settings table whose word " + unknown +
      " has no meaning in the core; rebuild from one source tree" + Where()));
}

Status Context::SetUpNodeMemory() {
  if (allreduce == AllreduceAlgorithm::kHierarchical && !homogeneous) {
    return Status::InvalidArgument(
        "DDL_ALLREDUCE=hierarchical needs the same number of ranks on every node, but local "
        "sizes differ; use DDL_ALLREDUCE=flat or auto" + Where());
  }
  // With racks LearnRacks refused uneven nodes.
  const bool use_node_memory = UseNodeMemory(allreduce, local_size, homogeneous);
  if (!use_node_memory) return Status::Ok();
  // Ranks grouped by DDL_LOCAL_SIZE must really share memory. Checked per
  // node, agreed by the world: every rank fails together.
  Status shares = Status::Ok();
  if (local->SplitByMachine(local_rank)->size() != local_size) {
    shares = Status::InvalidArgument(
        "the ranks of a node (DDL_LOCAL_SIZE=" + std::to_string(local_size) +
        ") do not all share memory on one machine; use a DDL_LOCAL_SIZE that divides the ranks "
        "per machine, or DDL_ALLREDUCE=flat" + Where());
  }
  Status s = AgreeOnOutcome(*world, shares);
  if (!s.ok()) return s;
  // The staging slots: the path's size, or smaller within DDL_SHM_ARENA_MB
  // (the same on every node: a chunk's slices cross nodes together).
  // The chain across 3 or more nodes fills and drains once per chunk:
  // the rack allreduce's larger chunks keep that a small part of each.
  const bool chain_across = network == NetworkShape::kUnknown && cross_size >= 3;
  size_t slot = racks || chain_across ? kRackChunkBytes
                : cross_size > 1      ? kCrossNodeChunkBytes
                                      : kNodeChunkBytes;
  if (config.shm_arena_mb > 0) {
    const size_t cap = static_cast<size_t>(config.shm_arena_mb * 1024 * 1024);
    while (slot > kMinSlotBytes && ShmArena::SegmentBytes(local_size, slot, kNodeSlots) > cap) {
      slot /= 2;
    }
    const size_t least = ShmArena::SegmentBytes(local_size, slot, kNodeSlots);
    if (least > cap) {
      return Status::InvalidArgument(
          "environment variable DDL_SHM_ARENA_MB=" + Number(config.shm_arena_mb) +
          " is too small for " + std::to_string(local_size) + " ranks per node: their staging "
          "area needs at least " + std::to_string(least) + " bytes (" +
          std::to_string(kNodeSlots) + " slots of 64 KiB per rank); raise it, or use "
          "DDL_ALLREDUCE=flat" + Where());
    }
  }
  // A name unique to this job (rank 0's pid and clock) and node (the world
  // rank of its local rank 0).
  std::vector<int64_t> token = world->AllgatherInt64(
      rank == 0 ? static_cast<int64_t>(getpid()) * 1000003 +
                      std::chrono::steady_clock::now().time_since_epoch().count() % 1000003
                : 0);
  std::vector<int64_t> node_id = local->AllgatherInt64(rank);
  // Committed here, so a /dev/shm too small for it is this error on every
  // rank of the job, never a SIGBUS in the middle of an allreduce.
  Status made = Status::Ok();
  try {
    node_memory = ShmArena::Create(*local, std::to_string(token[0]) + "." +
                                               std::to_string(node_id[0]),
                                   slot, kNodeSlots);
  } catch (const ShmTooSmall& e) {
    made = Status::FailedPrecondition(std::string(e.what()) + Where());
  } catch (const TransportError& e) {
    made = Status::Internal(std::string(e.what()) + Where());
  }
  s = AgreeOnOutcome(*world, made);
  if (!s.ok()) {
    node_memory.reset();
    return s;
  }
  node_memory->SetPeerTimeout(config.peer_timeout_s);
  node_memory->SetLiveness(judge.get());
  hierarchical = cross_size > 1;
  SetUpAgreement(std::to_string(token[0]) + "." + std::to_string(node_id[0]) + ".agree");
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

void Context::SetUpAgreement(const std::string& token) {
  if (cross_size != 1 || size < 2) return;
  // The cycle's words: flags, two bits per cache slot, a bit per rank
  // (negotiation/controller.cc). A cache too large for 64 KiB keeps MPI.
  const size_t words = 1 + 2 * ((static_cast<size_t>(config.cache_capacity) + 63) / 64) +
                       (static_cast<size_t>(size) + 63) / 64;
  Status made = Status::Ok();
  try {
    if (words <= 8192) agreement = std::make_unique<NodeAgreement>(*world, *local, token, words);
  } catch (const TransportError& e) {
    made = Status::Internal(e.what());
  }
  // Every rank uses it, or none: a round half in shared memory, half over
  // MPI would never end. Without it the cycle is MPI's, as before.
  if (!AgreeOnOutcome(*world, made).ok()) agreement.reset();
  if (!agreement) return;
  agreement->memory().SetPeerTimeout(config.peer_timeout_s);
  agreement->memory().SetLiveness(judge.get());
}

// Every rank parses its environment, then all learn whether any rank failed,
// so a bad value on one rank is an error everywhere instead of a hang in
// the next collective. The lowest failing rank's message is reported. Then
// the settings that must be equal are compared (CompareSharedSettings).
Status Context::AgreeOnConfig(Context* ctx, ControlPlane& world) {
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
  const std::vector<int64_t> failed = world.AllgatherInt64(mine.ok() ? 0 : 1);
  const int first_failed =
      static_cast<int>(std::find(failed.begin(), failed.end(), 1) - failed.begin());
  if (first_failed < ctx->size) {
    std::vector<char> message(mine.message().begin(), mine.message().end());
    world.BroadcastBytes(message, first_failed);
    return Status::InvalidArgument(std::string(message.begin(), message.end()) + " (on rank " +
                                   std::to_string(first_failed) + "; reported by rank " +
                                   std::to_string(ctx->rank) + ")");
  }
  return CompareSharedSettings(ctx->config, world);
}

std::string Context::DescribeNetwork(std::string* schedule) const {
  const int nodes = static_cast<int>(topology.rack_of_node.size());
  std::string probe;  // what the probe found, when one ran
  if (topology.source == "probe" && !topology.probe_verdict.empty()) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.2f", topology.probe_seconds);
    probe = std::string(topology.probed_by_default
                            ? "no topology given, so the node leaders probed the network at init"
                            : "DDL_TOPOLOGY=probe") +
            " (verdict " + topology.probe_verdict + ": " + topology.probe_reason + "; " +
            (topology.probe_checks.empty() ? "" : topology.probe_checks + "; ") + seconds +
            " s): ";
  }
  std::string what, how;
  if (racks) {
    what = "racks";
    how = probe + topology.Describe();
  } else if (nodes <= 1) {
    what = "none";
    how = topology.Describe();
  } else if (network == NetworkShape::kUnknown && nodes >= 3) {
    what = "chain";
    how = probe +
          (topology.source.empty()         ? std::string("no topology given")
           : topology.source == "unknown" ? std::string("no topology given (DDL_TOPOLOGY=unknown)")
                                           : topology.Describe()) +
          ": allreduces of " + std::to_string(kChainMinBytes >> 10) +
          " KiB or more per rank across the " + std::to_string(nodes) +
          " nodes take the chain in rank order (CHAIN_ALLREDUCE: neighbour links only, two "
          "flows per link)";
  } else {
    what = "pairwise";
    how = probe +
          (topology.source.empty() ? "no topology given: " + std::to_string(nodes) + " nodes"
                                   : topology.Describe()) +
          (nodes == 2 ? "" : allreduce == AllreduceAlgorithm::kAuto ? ""
                             : " (DDL_ALLREDUCE asks for the one-switch schedules)") +
          ": large allreduces across nodes take the pairwise reduce-scatter and ring "
          "all-gather (PAIRWISE_RING_ALLREDUCE)";
  }
  if ((topology.untold() || topology.probed_by_default) && nodes > 1) {
    how += "; to describe the racks set DDL_TOPOLOGY=\"RACK=HOST,HOST;RACK=...\", pass "
           "ddlrun -H HOST:SLOTS@RACK, or run under Slurm's topology plugin "
           "(SLURM_TOPOLOGY_ADDR); DDL_TOPOLOGY=none says one switch, DDL_TOPOLOGY=unknown "
           "skips the probe and keeps the chain";
  }
  if (schedule != nullptr) *schedule = what;
  return how;
}

Context::~Context() {
  if (activity) ActivityBoard::Get().Remove(world_rank, process_set);
}

std::string Context::Where() const {
  if (process_set == 0) return OnRank(world_rank);
  return " (rank " + std::to_string(world_rank) + ", process set " + std::to_string(process_set) +
         ")";
}

Status Context::CreateForGroup(std::unique_ptr<Group> group, int process_set,
                               const Config& config, std::unique_ptr<Context>* out) {
  auto ctx = std::make_unique<Context>();
  ctx->rank = group->rank();
  ctx->size = group->size();
  ctx->world_rank = group->WorldRank(ctx->rank);
  ctx->process_set = process_set;
  ctx->config = config;
  ctx->config.timeline_path.clear();  // the global context's timeline only
  Status s = ctx->Build(std::move(group));
  if (!s.ok()) return s;
  *out = std::move(ctx);
  return Status::Ok();
}

Status Context::Build(std::unique_ptr<Group> base) {
  world = std::move(base);
  // From here every wait has the peer timeout: the ranks have all come
  // (the configuration, or a process set, was agreed), so a rank that
  // stops answering is named instead of waited for forever.
  world->SetPeerTimeout(config.peer_timeout_s);
  world->SetSpinPolls(config.spin_polls);
  try {
    Status read = ReadChoices();
    if (!read.ok()) return read;
    // Nodes are cut by world rank, so a process set's node groups are the
    // job's nodes restricted to the set.
    local = config.local_size > 0 ? world->Split(world_rank / config.local_size, rank)
                                  : world->SplitByMachine(rank);
    local_rank = local->rank();
    local_size = local->size();
    cross = world->Split(local_rank, rank);
    cross_rank = cross->rank();
    cross_size = cross->size();
    for (Group* g : {world.get(), local.get(), cross.get()}) {
      g->SetPeerTimeout(config.peer_timeout_s);
      g->SetSpinPolls(config.spin_polls);
    }
    std::vector<int64_t> local_sizes = world->AllgatherInt64(local_size);
    for (int64_t n : local_sizes) homogeneous &= (n == local_size);
    peers = PeerTable::Exchange(*world, config.job_secret);
    // Now the ranks can probe each other: every later wait asks the judge
    // before it gives up (liveness.h).
    activity = ActivityBoard::Get().Add(world_rank, process_set, world.get());
    judge = std::make_unique<ProbeJudge>(peers, process_set, activity, world.get(),
                                         config.peer_timeout_s, Where());
    for (Group* g : {world.get(), local.get(), cross.get()}) g->SetLiveness(judge.get());
    Status s = LearnRacks();
    if (!s.ok()) return s;
    return SetUpNodeMemory();
  } catch (const TransportError& e) {
    return Status::Internal(std::string("setting up the groups of ranks failed: ") + e.what() +
                            Where());
  }
}

Status Context::Create(std::unique_ptr<Group> world, std::unique_ptr<Context>* out,
                       Environment racks_from) {
  auto ctx = std::make_unique<Context>();
  ctx->racks_from_ = std::move(racks_from);
  ctx->rank = world->rank();
  ctx->size = world->size();
  ctx->world_rank = world->WorldRank(ctx->rank);
  Status s;
  try {
    s = AgreeOnConfig(ctx.get(), *world);
    if (!s.ok()) return s;
    // The settings are agreed, so every rank has come: from here a rank
    // late to a set-up step is waited for the peer timeout, not forever.
    world->SetPeerTimeout(ctx->config.peer_timeout_s);
    ctx->setup = world->Split(0, ctx->rank);
    // add_process_set's rounds wait with deadlines of their own; its split
    // waits for every rank with the peer timeout (MpiTransport::Split).
    ctx->setup->SetPeerTimeout(ctx->config.peer_timeout_s);
  } catch (const TransportError& e) {
    return Status::Internal(std::string("setting up the world group failed: ") + e.what() +
                            ctx->Where());
  }
  s = ctx->Build(std::move(world));
  if (!s.ok()) return s;
  // ddlrun --verbose: what the ranks agreed on, once, from rank 0.
  if (ctx->rank == 0 && ctx->config.print_topology == 1) {
    const char* algorithm = ctx->racks               ? "racks"
                            : !ctx->node_memory      ? "flat"
                            : ctx->hierarchical      ? "hierarchical"
                                                     : "shared_memory";
    std::fprintf(stderr, "[keras_ddl] topology: %s; %d rank(s) per node; allreduce: %s\n",
                 ctx->DescribeNetwork().c_str(), ctx->local_size, algorithm);
  }
  *out = std::move(ctx);
  return Status::Ok();
}

}  // namespace ddl
