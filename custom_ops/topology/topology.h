// Which rack each rank is in, as a real cluster tells it (docs/topology.md).
//
// Each rank reads its own environment:
//   DDL_TOPOLOGY   "RACK=HOST,HOST;RACK=HOST,...": racks by host name (what
//                  ddlrun -H host:slots@rack and a hostfile's rack column
//                  become); "none" for one switch whatever Slurm says;
//                  "probe" to measure them at start-up (topology_probe.h:
//                  the agreement gives one switch with source "probe",
//                  which the probe's verdict then replaces); "unknown"
//                  for no racks and no probe (source "unknown": the
//                  schedules of a network nobody described, at once);
//   SLURM_TOPOLOGY_ADDR / SLURM_TOPOLOGY_ADDR_PATTERN
//                  Slurm's tree topology: "core.rack1.node3" with
//                  "switch.switch.node"; the rack is the switch path above
//                  the node (here "core.rack1");
// in that order; with neither, no topology given (source ""): the engine
// then probes the network when the job has 3 or more nodes on hosts of
// their own (context.cc, docs/untold_network.md). Then every rank
// offers what it saw to rank 0, which either builds the topology or names
// the ranks that disagree and what each saw, and tells every rank the
// same verdict: a disagreement is an error on every rank, never a hang.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../common/types.h"
#include "../common/util.h"
#include "../transport/control_plane.h"

namespace ddl {

// What one rank learned from its environment.
struct RackPlace {
  std::string host;    // this rank's host name
  std::string rack;    // empty: no rack known (one switch)
  // "DDL_TOPOLOGY", "SLURM_TOPOLOGY_ADDR", "probe", "unknown" or "" (none)
  std::string source;
  std::string setting; // the value it came from (the whole DDL_TOPOLOGY text)
  std::string error;   // the environment could not be read; empty if fine
};

// Reads the variables above through `getenv` (nullptr when unset) for a
// process on `host`. Never fails: a malformed value is put in `error`, so
// that every rank hears of it in the agreement.
RackPlace DetectRack(const std::function<const char*(const char*)>& getenv,
                     const std::string& host);

// The agreed topology. Racks are numbered by their lowest rank, nodes by
// their lowest rank too, so every rank numbers them alike.
struct Topology {
  std::vector<std::string> racks;   // names; one entry "" without racks
  std::vector<int> rack_of_rank;    // index into racks, per rank
  std::vector<int> node_of_rank;    // index of the rank's node in the job
  std::vector<int> rack_of_node;    // index into racks, per node
  std::vector<std::string> host_of_node;  // the host name of each node's first rank
  std::string source;               // as in RackPlace
  // Nodes in each rack when every rack has as many, otherwise 0.
  int nodes_per_rack = 0;
  // The probe could not tell (source "probe"): one switch above, but
  // treated as a network nobody described.
  bool uncertain = false;
  // What the probe took at start-up (source "probe"), rank 0's clock.
  double probe_seconds = 0;
  // The probe's verdict ("racks", "one switch", "unclear"); empty when no
  // probe ran.
  std::string probe_verdict;
  std::string probe_reason;  // the verdict's one-line why
  // What the probe measured after its first pass and what that showed
  // (ProbeVerdict::checks): for racks "confirmed: ..." or, when a second
  // pass disagreed and the verdict became unclear, "unconfirmed: ...".
  std::string probe_checks;
  bool probe_confirmed = false;  // racks a second, independent pass found too
  // The probe ran because nothing described the network (no
  // DDL_TOPOLOGY=probe): source is "probe" since.
  bool probed_by_default = false;
  // Nothing (not even the probe) says what the network is: no topology
  // given, DDL_TOPOLOGY=unknown, or a probe that could not tell.
  bool untold() const { return source.empty() || source == "unknown" || uncertain; }
  int num_racks() const { return static_cast<int>(racks.size()); }
  // "2 racks x 4 nodes (SLURM_TOPOLOGY_ADDR): rack1 = ranks 0-3, ..."
  std::string Describe() const;
};

// Every rank of `world` calls it with what it saw and the id of its node
// (the same for ranks sharing a node, e.g. the world rank of its local
// rank 0). On error every rank gets the same message naming the ranks and
// what each saw.
Status AgreeOnTopology(ControlPlane& world, const RackPlace& mine, int64_t node_id,
                       Topology* out);

}  // namespace ddl
