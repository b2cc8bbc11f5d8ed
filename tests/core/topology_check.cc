// Topology detection (topology/topology.h): reading DDL_TOPOLOGY and Slurm's
// SLURM_TOPOLOGY_ADDR from a given environment, and the agreement over
// threads as ranks (tests/core/in_process.h): the racks and nodes every
// rank ends with, and for ranks that disagree, the same error on every
// rank naming the ranks and what each saw. DDL_TOPOLOGY=probe
// (topology/topology_probe.h): the verdict from given rates (racks
// contiguous or interleaved in rank order, uneven, one switch, and the
// unclear cases), the topology it makes, and the measurement on threads as
// ranks, whose verdict every rank shares. Prints "<N> checks, <F> failures".
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "topology/topology.h"
#include "topology/topology_probe.h"
#include "in_process.h"

using namespace ddl;
using ddl_test::Expect;
using ddl_test::InProcessGroup;
using ddl_test::InProcessRank;

namespace {

using Env = std::map<std::string, std::string>;

RackPlace Detect(const Env& env, const std::string& host) {
  return DetectRack(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      host);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void CheckDetect() {
  const std::string two = "r1=node1,node2; r2 = node3 , node4.example.org";
  RackPlace p = Detect({{"DDL_TOPOLOGY", two}}, "node2");
  Expect(p.error.empty() && p.rack == "r1" && p.source == "DDL_TOPOLOGY",
         "DDL_TOPOLOGY puts node2 in r1: " + p.rack + p.error);
  p = Detect({{"DDL_TOPOLOGY", two}}, "node3.example.org");
  Expect(p.rack == "r2", "a full host name matches its short name in DDL_TOPOLOGY: " + p.error);
  p = Detect({{"DDL_TOPOLOGY", two}}, "node4");
  Expect(p.rack == "r2", "a short host name matches a full one in DDL_TOPOLOGY: " + p.error);
  p = Detect({{"DDL_TOPOLOGY", two}}, "node5");
  Expect(Contains(p.error, "does not name this host 'node5'"), "an unlisted host: " + p.error);
  p = Detect({{"DDL_TOPOLOGY", "r1=a,b;r2"}}, "a");
  Expect(Contains(p.error, "'r2' names no rack"), "an entry without '=': " + p.error);
  p = Detect({{"DDL_TOPOLOGY", "r1=a,,b"}}, "a");
  Expect(Contains(p.error, "empty host name"), "an empty host: " + p.error);
  p = Detect({{"DDL_TOPOLOGY", "r1=a;r2=a"}}, "a");
  Expect(Contains(p.error, "host 'a' is in rack 'r1' and in rack 'r2'"), "a host twice: " + p.error);
  p = Detect({{"DDL_TOPOLOGY", ";"}}, "a");
  Expect(Contains(p.error, "names no racks"), "no racks: " + p.error);
  // "none" overrides Slurm; DDL_TOPOLOGY comes first.
  p = Detect({{"DDL_TOPOLOGY", "none"}, {"SLURM_TOPOLOGY_ADDR", "s1.n1"}}, "n1");
  Expect(p.error.empty() && p.rack.empty() && p.source == "DDL_TOPOLOGY", "DDL_TOPOLOGY=none");
  p = Detect({{"SLURM_TOPOLOGY_ADDR", "core.rack2.n7"},
              {"SLURM_TOPOLOGY_ADDR_PATTERN", "switch.switch.node"}}, "n7");
  Expect(p.error.empty() && p.rack == "core.rack2" && p.source == "SLURM_TOPOLOGY_ADDR",
         "Slurm's leaf switch path is the rack: " + p.rack + p.error);
  p = Detect({{"SLURM_TOPOLOGY_ADDR", "leaf3.n7"}}, "n7");
  Expect(p.rack == "leaf3", "without a pattern the last name is the node's: " + p.rack);
  p = Detect({{"SLURM_TOPOLOGY_ADDR", "n7"}, {"SLURM_TOPOLOGY_ADDR_PATTERN", "node"}}, "n7");
  Expect(p.error.empty() && p.rack.empty(), "Slurm without switches: one switch");
  p = Detect({{"SLURM_TOPOLOGY_ADDR", "a.b.n7"}, {"SLURM_TOPOLOGY_ADDR_PATTERN", "switch.node"}},
             "n7");
  Expect(Contains(p.error, "has 3 names but SLURM_TOPOLOGY_ADDR_PATTERN='switch.node' has 2"),
         "Slurm's address and pattern differ in length: " + p.error);
  p = Detect({}, "n1");
  Expect(p.error.empty() && p.rack.empty() && p.source.empty(), "no variables: one switch");
  // "unknown" overrides Slurm too: no racks, and no probe either.
  p = Detect({{"DDL_TOPOLOGY", " unknown"}, {"SLURM_TOPOLOGY_ADDR", "s1.n1"}}, "n1");
  Expect(p.error.empty() && p.rack.empty() && p.source == "unknown", "DDL_TOPOLOGY=unknown");
  p = Detect({{"DDL_TOPOLOGY", "unknwon"}}, "n1");
  Expect(Contains(p.error, "none, probe or unknown"),
         "a misspelt word names the words: " + p.error);
  Expect(RankRuns({0, 1, 2, 3, 6, 9, 10}) == "0-3, 6, 9-10", "rank runs");
}

// Runs the agreement on `places.size()` threads; node of rank r: nodes[r].
std::vector<std::pair<Status, Topology>> Agree(const std::vector<RackPlace>& places,
                                               const std::vector<int64_t>& nodes) {
  const int n = static_cast<int>(places.size());
  std::vector<std::pair<Status, Topology>> out(n);
  InProcessGroup group(n, 1 << 20);
  group.Run([&](int r) {
    InProcessRank plane(group, r);
    out[r].first = AgreeOnTopology(plane, places[r], nodes[r], &out[r].second);
  });
  return out;
}

void CheckAgreement() {
  // 2 racks x 2 nodes x 2 ranks from Slurm.
  std::vector<RackPlace> places;
  std::vector<int64_t> nodes;
  for (int r = 0; r < 8; ++r) {
    const int node = r / 2;
    const std::string host = "n" + std::to_string(node + 1);
    places.push_back(Detect({{"SLURM_TOPOLOGY_ADDR", "core.rack" + std::to_string(node / 2 + 1) +
                                                         "." + host}},
                            host));
    nodes.push_back(node * 2);
  }
  auto got = Agree(places, nodes);
  for (int r = 0; r < 8; ++r) {
    const Topology& t = got[r].second;
    Expect(got[r].first.ok() && t.num_racks() == 2 && t.nodes_per_rack == 2 &&
               t.rack_of_rank == std::vector<int>({0, 0, 0, 0, 1, 1, 1, 1}) &&
               t.node_of_rank == std::vector<int>({0, 0, 1, 1, 2, 2, 3, 3}) &&
               t.rack_of_node == std::vector<int>({0, 0, 1, 1}),
           "rank " + std::to_string(r) + " agrees on 2 racks x 2 nodes: " +
               got[r].first.message());
  }
  Expect(got[0].second.Describe() ==
             "2 racks x 2 nodes (SLURM_TOPOLOGY_ADDR): core.rack1 = ranks 0-3; core.rack2 = "
             "ranks 4-7",
         "the description: " + got[0].second.Describe());

  // Ranks 6 and 7 (node n4) read no topology: every rank names them.
  auto missing = places;
  missing[6] = missing[7] = Detect({}, "n4");
  got = Agree(missing, nodes);
  for (int r = 0; r < 8; ++r) {
    const std::string& m = got[r].first.message();
    Expect(!got[r].first.ok() && Contains(m, "ranks disagree about the topology") &&
               Contains(m, "ranks 0-1 (host n1) saw rack 'core.rack1' from "
                           "SLURM_TOPOLOGY_ADDR=core.rack1.n1") &&
               Contains(m, "ranks 6-7 (host n4) saw no topology") && m == got[0].first.message(),
           "rank " + std::to_string(r) + " names the ranks without a topology: " + m);
  }

  // Different DDL_TOPOLOGY texts (rank 5 was given another one).
  std::vector<RackPlace> ddl;
  for (int r = 0; r < 8; ++r) {
    const std::string host = "n" + std::to_string(r / 2 + 1);
    ddl.push_back(Detect({{"DDL_TOPOLOGY", r == 5 ? "a=n1,n2,n3;b=n4" : "a=n1,n2;b=n3,n4"}},
                         host));
  }
  got = Agree(ddl, nodes);
  for (int r = 0; r < 8; ++r) {
    const std::string& m = got[r].first.message();
    Expect(!got[r].first.ok() && Contains(m, "rank 5 (host n3) saw rack 'a' from "
                                             "DDL_TOPOLOGY=a=n1,n2,n3;b=n4") &&
               Contains(m, "rank 4 (host n3) saw rack 'b'"),
           "rank " + std::to_string(r) + " names the rank with another DDL_TOPOLOGY: " + m);
  }

  // A malformed value on one rank is an error on all, naming it.
  auto bad = ddl;
  for (int r = 0; r < 8; ++r) bad[r] = Detect({{"DDL_TOPOLOGY", "a=n1,n2;b=n3,n4"}}, "n" + std::to_string(r / 2 + 1));
  got = Agree(bad, nodes);
  for (int r = 0; r < 8; ++r) {
    Expect(got[r].first.ok() && got[r].second.racks == std::vector<std::string>({"a", "b"}) &&
               got[r].second.rack_of_rank == std::vector<int>({0, 0, 0, 0, 1, 1, 1, 1}),
           "rank " + std::to_string(r) + " agrees on DDL_TOPOLOGY's racks: " +
               got[r].first.message());
  }
  bad[2] = Detect({{"DDL_TOPOLOGY", "a=n1,n2;b=n3,n4"}}, "n9");
  got = Agree(bad, nodes);
  for (int r = 0; r < 8; ++r) {
    const std::string& m = got[r].first.message();
    Expect(!got[r].first.ok() && Contains(m, "the topology could not be read: rank 2 (host n9)") &&
               Contains(m, "does not name this host 'n9'"),
           "rank " + std::to_string(r) + " names the rank whose host is unlisted: " + m);
  }

  // Two ranks of one node in different racks.
  auto split = places;
  split[3] = Detect({{"SLURM_TOPOLOGY_ADDR", "core.rack9.n2"}}, "n2");
  got = Agree(split, nodes);
  for (int r = 0; r < 8; ++r) {
    const std::string& m = got[r].first.message();
    Expect(!got[r].first.ok() && Contains(m, "ranks of one node disagree about its rack") &&
               Contains(m, "rank 2 (host n2) saw rack 'core.rack1'") &&
               Contains(m, "rank 3 (host n2) saw rack 'core.rack9'"),
           "rank " + std::to_string(r) + " names the node's ranks and racks: " + m);
  }

  // Uneven racks: 3 nodes in one, 1 in the other; and no topology at all.
  std::vector<RackPlace> uneven;
  std::vector<int64_t> one_each;
  for (int r = 0; r < 4; ++r) {
    const std::string host = "n" + std::to_string(r + 1);
    uneven.push_back(Detect({{"DDL_TOPOLOGY", "x=n1,n2,n3;y=n4"}}, host));
    one_each.push_back(r);
  }
  got = Agree(uneven, one_each);
  Expect(got[0].first.ok() && got[0].second.num_racks() == 2 && got[0].second.nodes_per_rack == 0,
         "uneven racks agree, with no common rack size: " + got[0].first.message());
  std::vector<RackPlace> none(4, Detect({}, "h"));
  got = Agree(none, one_each);
  Expect(got[3].first.ok() && got[3].second.num_racks() == 1 &&
             got[3].second.Describe() == "no topology given: 4 node(s)" &&
             got[3].second.untold(),
         "no topology: one switch; " + got[3].second.Describe());
  // Each node's host, which decides whether the nodes can be probed.
  for (int r = 0; r < 4; ++r) none[r] = Detect({}, "h" + std::to_string(r / 2));
  got = Agree(none, {0, 0, 2, 2});
  Expect(got[1].first.ok() && got[1].second.host_of_node == std::vector<std::string>({"h0", "h1"}),
         "the host of every node");
  std::vector<RackPlace> unknown(4, Detect({{"DDL_TOPOLOGY", "unknown"}}, "h"));
  got = Agree(unknown, one_each);
  Expect(got[2].first.ok() && got[2].second.source == "unknown" && got[2].second.untold() &&
             got[2].second.Describe() == "no topology given (DDL_TOPOLOGY=unknown): 4 node(s)",
         "DDL_TOPOLOGY=unknown: untold, " + got[2].second.Describe());
  // DDL_TOPOLOGY=probe everywhere: one switch to be measured; with
  // another text on one rank, every rank names it.
  std::vector<RackPlace> probe(4, Detect({{"DDL_TOPOLOGY", " probe "}}, "h"));
  got = Agree(probe, one_each);
  Expect(got[1].first.ok() && got[1].second.source == "probe" && got[1].second.num_racks() == 1,
         "DDL_TOPOLOGY=probe agrees on one switch to measure: " + got[1].first.message());
  probe[2] = Detect({{"DDL_TOPOLOGY", "none"}}, "h");
  got = Agree(probe, one_each);
  Expect(!got[0].first.ok() && Contains(got[0].first.message(), "DDL_TOPOLOGY= probe  (racks to be measured)") &&
             Contains(got[0].first.message(), "rank 2 (host h) saw one switch from DDL_TOPOLOGY=none"),
         "probe on some ranks, none on another: " + got[0].first.message());
}

// rate[from][to] in bytes per second: `fast` within a group, `slow`
// across, with a little noise so no two rates are equal.
std::vector<std::vector<double>> Rates(const std::vector<int>& group, double fast, double slow) {
  const int k = static_cast<int>(group.size());
  std::vector<std::vector<double>> rate(k, std::vector<double>(k, 0.0));
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j) {
      if (i != j) rate[i][j] = (group[i] == group[j] ? fast : slow) * (1 + 0.01 * ((i * 7 + j * 3) % 5));
    }
  }
  return rate;
}

// What the probe measures on 2 racks of `n` nodes listed rack by rack,
// node links `link` and uplinks `up` each way: in the round at distance d
// min(d, 2n - d) flows of each rack cross its uplink and share it; a pair
// inside a rack gets its node link. `interleaved`: the racks are the even
// and the odd nodes, so every flow of an odd round crosses.
std::vector<std::vector<double>> TwoRacks(int n, double link, double up, bool interleaved = false) {
  const int k = 2 * n;
  std::vector<std::vector<double>> rate(k, std::vector<double>(k, 0.0));
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j) {
      if (i == j) continue;
      const int d = (j - i + k) % k;
      const bool across = interleaved ? (i % 2 != j % 2) : (i / n != j / n);
      const int flows = interleaved ? n : std::min(d, k - d);
      rate[i][j] = across ? std::min(link, up / flows) : link;
    }
  }
  return rate;
}

void CheckProbeVerdicts() {
  using K = ProbeVerdict::Kind;
  auto verdict = [](const std::vector<std::vector<double>>& r) { return ClassifyProbeRates(r); };
  // 2 racks x 4 contiguous, 1 GB/s inside, a quarter of that across.
  const std::vector<int> contiguous = {0, 0, 0, 0, 1, 1, 1, 1};
  ProbeVerdict v = verdict(Rates(contiguous, 1e9, 2.5e8));
  Expect(v.kind == K::kRacks && v.group_of_node == contiguous, "2 x 4 contiguous: racks " + v.reason);
  // Interleaved in rank order, 3 racks; groups numbered by their lowest node.
  const std::vector<int> interleaved = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
  v = verdict(Rates(interleaved, 4e8, 1e8));
  Expect(v.kind == K::kRacks && v.group_of_node == interleaved, "3 interleaved racks: " + v.reason);
  // Uneven racks are racks (the rack allreduce then declines them).
  const std::vector<int> uneven = {0, 0, 0, 1, 1, 1, 1, 1};
  v = verdict(Rates(uneven, 1e9, 1e8));
  Expect(v.kind == K::kRacks && v.group_of_node == uneven, "3 + 5 nodes: racks " + v.reason);
  // Every pair fast: one switch; two nodes, one pair: one switch too.
  v = verdict(Rates(std::vector<int>(8, 0), 1e9, 1e9));
  Expect(v.kind == K::kOneSwitch, "all fast: one switch " + v.reason);
  v = verdict(Rates({0, 1}, 1e9, 1e8));
  Expect(v.kind == K::kOneSwitch, "2 nodes: the one pair is the fastest tenth: one switch");
  // Across at 0.8 of within: no rack boundary; at 0.45, one (2:1).
  v = verdict(Rates(contiguous, 1e9, 8e8));
  Expect(v.kind == K::kOneSwitch, "across at 0.8 of the rate inside: one switch " + v.reason);
  v = verdict(Rates(contiguous, 1e9, 4.5e8));
  Expect(v.kind == K::kRacks, "across at 0.45 of the rate inside: racks " + v.reason);
  auto close = Rates(contiguous, 1e9, 2.5e8);
  close[1][6] = close[6][1] = 7e8;  // one pair across nearly as fast as inside
  v = verdict(close);
  Expect(v.kind == K::kUnclear, "a fast pair across merges the groups: unclear " + v.reason);
  // A node slow to everyone (a starved rank): unclear, not a rack of one.
  auto starved = Rates(std::vector<int>(8, 0), 1e9, 1e9);
  for (int j = 0; j < 8; ++j) {
    if (j != 5) starved[5][j] = starved[j][5] = 1e8;
  }
  v = verdict(starved);
  Expect(v.kind == K::kUnclear, "one slow node: unclear " + v.reason);
  // A slow pair inside a group (a busy core in both passes) does not
  // undo the grouping.
  auto holey = Rates(contiguous, 1e9, 1e8);
  holey[0][3] = holey[3][0] = 2e8;
  v = verdict(holey);
  Expect(v.kind == K::kRacks && v.group_of_node == contiguous,
         "a slow pair inside a group: still racks " + v.reason);
  // The one-switch verdict is never given behind an oversubscribed uplink
  // (kProbeOneSwitchShare). 2 x 4 nodes at 1 Gbit/s: 250 Mbit/s uplinks
  // show racks; uplinks of one node link's rate (4:1) link the racks
  // through the pairs of the one-flow rounds: unclear; uplinks of two
  // (2:1): every pair at least half the fastest, which passed as one switch
  // before, but the farthest pairs below 2/3 of the median: unclear; four
  // (non-blocking): one switch.
  const double gbit = 125e6;
  v = verdict(TwoRacks(4, gbit, gbit / 4));
  Expect(v.kind == K::kRacks && v.group_of_node == contiguous, "2 x 4 at 4:1: racks " + v.reason);
  v = verdict(TwoRacks(4, gbit, gbit));
  Expect(v.kind == K::kUnclear, "2 x 4, uplinks of 1 Gbit/s: unclear " + v.reason);
  v = verdict(TwoRacks(4, gbit, 2 * gbit));
  Expect(v.kind == K::kUnclear, "2 x 4, uplinks at 2:1: unclear, not one switch " + v.reason);
  v = verdict(TwoRacks(4, gbit, 4 * gbit));
  Expect(v.kind == K::kOneSwitch, "2 x 4, non-blocking uplinks: one switch " + v.reason);
  // 2 x 8 at 400/100 Mbit/s, and behind uplinks at 2:1.
  v = verdict(TwoRacks(8, 50e6, 12.5e6));
  Expect(v.kind == K::kRacks, "2 x 8 at 400/100 Mbit/s: racks " + v.reason);
  v = verdict(TwoRacks(8, 50e6, 200e6));
  Expect(v.kind != K::kOneSwitch, "2 x 8, uplinks at 2:1: not one switch " + v.reason);
  // Racks interleaved in rank order: the median pair is one across, but
  // the fastest tenth's half still splits them.
  v = verdict(TwoRacks(4, gbit, gbit, true));
  Expect(v.kind == K::kRacks && v.group_of_node == std::vector<int>({0, 1, 0, 1, 0, 1, 0, 1}),
         "2 x 4 interleaved, 1 Gbit/s uplinks: racks " + v.reason);
  // One switch measured by ranks that share cores: a few pairs far above
  // the link rate (a late receiver finds its bytes arrived) and some a
  // third below; the median keeps the verdict.
  auto noisy = Rates(std::vector<int>(8, 0), 1.2e8, 1.2e8);
  noisy[0][7] = noisy[7][0] = 9e8;
  noisy[2][3] = noisy[3][2] = 6e8;
  noisy[4][5] = noisy[5][4] = 8.5e7;
  noisy[1][6] = 8.6e7;
  v = verdict(noisy);
  Expect(v.kind == K::kOneSwitch, "one switch with outliers both ways: one switch " + v.reason);
  // 16 nodes: 2 racks x 8.
  std::vector<int> sixteen(16);
  for (int i = 0; i < 16; ++i) sixteen[i] = i / 8;
  v = verdict(Rates(sixteen, 5e7, 6e6));
  Expect(v.kind == K::kRacks && v.group_of_node == sixteen, "2 x 8: racks " + v.reason);
  const std::string table = DescribeProbe(Rates(contiguous, 1e9, 2.5e8),
                                          verdict(Rates(contiguous, 1e9, 2.5e8)),
                                          {0, 2, 4, 6, 8, 10, 12, 14}, 512 << 10, 0.5);
  Expect(Contains(table, "keras_ddl topology probe: 8 nodes, 7 rounds") &&
             Contains(table, "sends 512 KiB") &&
             Contains(table, "probe1  4      0, 2, 4, 6") && Contains(table, "verdict: racks") &&
             Contains(table, "node 7 (p2)"),
         "the probe's table:\n" + table);

  // The verdict made a topology: 2 racks x 2 nodes x 2 ranks.
  Topology t;
  t.racks = {""};
  t.source = "probe";
  t.rack_of_node = {0, 0, 0, 0};
  t.node_of_rank = {0, 0, 1, 1, 2, 2, 3, 3};
  t.rack_of_rank.assign(8, 0);
  ProbeVerdict racks;
  racks.kind = K::kRacks;
  racks.group_of_node = {0, 1, 1, 0};
  ApplyProbeVerdict(racks, &t);
  Expect(t.num_racks() == 2 && t.nodes_per_rack == 2 &&
             t.rack_of_rank == std::vector<int>({0, 0, 1, 1, 1, 1, 0, 0}) && !t.uncertain &&
             t.Describe() == "2 racks x 2 nodes (probe): probe1 = ranks 0-1, 6-7; probe2 = ranks 2-5",
         "the probe's racks as the topology: " + t.Describe());
  ProbeVerdict unclear;
  unclear.group_of_node = {0, 0, 1, 2};
  ApplyProbeVerdict(unclear, &t);
  Expect(t.num_racks() == 1 && t.uncertain && t.nodes_per_rack == 4 &&
             t.Describe() == "the probe could not tell: 4 node(s)",
         "an unclear verdict: one switch, uncertain: " + t.Describe());
}

// A network for the judge (JudgeProbe) to measure: racks[n] is node n's
// rack, node links `link`, uplinks `up` each way. A flow inside a rack
// gets its link; a flow across shares its source rack's uplink out and
// its destination rack's uplink in with the round's other flows across
// them, and gets the smaller share. `noise(call, from, to, rate)` may
// lower a flow in the given measurement call (0 = the first pass).
struct ModelledNetwork {
  std::vector<int> racks;
  double link = 0, up = 0;
  std::function<double(int, int, int, double)> noise = [](int, int, int, double r) { return r; };
  int calls = 0;
  std::vector<int> rounds_per_call;

  ProbeRates operator()(const std::vector<ProbeRound>& plan) {
    const int k = static_cast<int>(racks.size());
    ProbeRates rate(k, std::vector<double>(k, -1.0));
    for (const ProbeRound& r : plan) {
      std::map<int, int> out, in;  // flows across, per rack
      for (int n = 0; n < k; ++n) {
        if (r[n] >= 0 && racks[n] != racks[r[n]]) ++out[racks[n]], ++in[racks[r[n]]];
      }
      for (int n = 0; n < k; ++n) {
        const int to = r[n];
        if (to < 0) continue;
        double x = link;
        if (racks[n] != racks[to]) {
          x = std::min(link, up / std::max(out[racks[n]], in[racks[to]]));
        }
        rate[n][to] = std::max(rate[n][to], noise(calls, n, to, x));
      }
    }
    ++calls;
    rounds_per_call.push_back(static_cast<int>(plan.size()));
    return rate;
  }
};

ProbeVerdict Judge(ModelledNetwork& net, double seconds = 0) {
  return JudgeProbe(static_cast<int>(net.racks.size()), std::ref(net), [=] { return seconds; });
}

// The judge's passes on modelled networks: noise in the first pass, a
// clean second; the re-measure of slow directions; confirmation.
void CheckProbeJudge() {
  using K = ProbeVerdict::Kind;
  const double gbit = 125e6;
  const std::vector<int> contiguous = {0, 0, 0, 0, 1, 1, 1, 1};
  // The modelled first pass agrees with the matrix model (TwoRacks).
  ModelledNetwork clean{contiguous, gbit, gbit / 4};
  ProbeRates first;
  ProbeVerdict v = JudgeProbe(8, std::ref(clean), [] { return 0.0; }, &first);
  const ProbeRates matrix = TwoRacks(4, gbit, gbit / 4);
  bool same = true;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) same = same && (i == j || first[i][j] == matrix[i][j]);
  }
  Expect(same, "the modelled first pass is the matrix model");
  // 2 x 4 at 4:1, clean: racks, confirmed by a second pass of 3 rounds
  // within and 1 across, with nothing measured again.
  Expect(v.kind == K::kRacks && v.group_of_node == contiguous && v.confirmed &&
             clean.calls == 2 && clean.rounds_per_call == std::vector<int>({7, 4}) &&
             v.rounds == 11 && Contains(v.checks, "confirmed: a second pass (4 rounds"),
         "2 x 4 at 4:1, clean: racks confirmed by a second pass: " + v.checks);
  // A noisy first pass splits rack 0 into {0, 2} and {1, 3} (the pairs at
  // distances 1 and 3 inside it lost their cores); a clean second pass
  // pairs {0, 2} with {1, 3} at a node link's rate, so it finds the true
  // racks, and a third pass confirms those: the right racks.
  ModelledNetwork split{contiguous, gbit, gbit / 4};
  split.noise = [](int call, int from, int to, double r) {
    const bool rack0 = from < 4 && to < 4;
    const bool odd = (from - to + 4) % 2 != 0;
    return call == 0 && rack0 && odd ? r / 5 : r;
  };
  v = Judge(split);
  Expect(v.kind == K::kRacks && v.group_of_node == contiguous && v.confirmed &&
             split.calls == 3 &&
             Contains(v.checks, "the first pass found nodes 0, 2 | 1, 3 | 4-7, a second pass "
                                "found nodes 0-3 | 4-7") &&
             Contains(v.checks, "confirmed: a third pass"),
         "a first pass splitting a rack: the right racks after two passes agree: " + v.checks);
  // The same split, then a clean second pass that finds the true racks,
  // and a third that is noisy in rack 1 (the pairs at odd distances in it
  // slow): the passes disagree, so unclear, never racks unconfirmed.
  ModelledNetwork disagree{contiguous, gbit, gbit / 4};
  disagree.noise = [](int call, int from, int to, double r) {
    const bool odd = (from - to + 8) % 2 != 0;
    const bool rack0 = from < 4 && to < 4, rack1 = from >= 4 && to >= 4;
    return (call == 0 && rack0 && odd) || (call == 2 && rack1 && odd) ? r / 5 : r;
  };
  v = Judge(disagree);
  Expect(v.kind == K::kUnclear && !v.confirmed && disagree.calls == 3 &&
             Contains(v.checks, "unconfirmed: the first pass found nodes 0, 2 | 1, 3 | 4-7, a "
                                "second pass found nodes 0-3 | 4-7, a third pass found nodes "
                                "0-3 | 4, 6 | 5, 7") &&
             Contains(v.reason, "not confirmed"),
         "three passes that disagree: unclear: " + v.checks);
  // A first pass splitting one switch into two groups: the second pass
  // finds one switch, so unclear (not acted on either way).
  ModelledNetwork parted{{0, 0, 0, 0}, gbit, gbit};
  parted.noise = [](int call, int from, int to, double r) {
    return call == 0 && (from - to + 4) % 2 != 0 ? r / 5 : r;
  };
  v = Judge(parted);
  Expect(v.kind == K::kUnclear && parted.calls == 2 &&
             Contains(v.checks, "a second pass found one switch"),
         "one switch split by a noisy first pass: unclear: " + v.checks);
  // An equal wrong split: racks {0, 1} {2, 3} {4, 5} {6, 7} from a noisy
  // first pass; the clean second pass finds 0-3 | 4-7, the third confirms.
  ModelledNetwork halves{contiguous, gbit, gbit / 4};
  halves.noise = [](int call, int from, int to, double r) {
    const bool same = from / 4 == to / 4, apart = from / 2 != to / 2;
    return call == 0 && same && apart ? r / 5 : r;
  };
  v = Judge(halves);
  Expect(v.kind == K::kRacks && v.group_of_node == contiguous && v.confirmed,
         "4 racks of 2 from noise: confirmed as the 2 racks of 4: " + v.checks);
  // One switch of 4 nodes with one slow direction in the first pass (a
  // receiver lost its core): unclear at first; its round measured again,
  // whole, gives one switch.
  ModelledNetwork one{{0, 0, 0, 0}, gbit, gbit};
  one.noise = [](int call, int from, int to, double r) {
    return call == 0 && from == 1 && to == 2 ? r / 3 : r;
  };
  v = Judge(one);
  Expect(v.kind == K::kOneSwitch && one.calls == 2 && one.rounds_per_call == std::vector<int>({3, 1}) &&
             Contains(v.checks, "1 direction(s) below the one-switch bar measured again in 1 "
                                "round(s), each keeping its faster: now one switch"),
         "one switch with a noisy pair: one switch after the re-measure: " + v.checks);
  // The same at 8 nodes, two noisy pairs.
  ModelledNetwork eight{std::vector<int>(8, 0), gbit, gbit};
  eight.noise = [](int call, int from, int to, double r) {
    return call == 0 && ((from == 3 && to == 6) || (from == 5 && to == 4)) ? r / 2 : r;
  };
  v = Judge(eight);
  Expect(v.kind == K::kOneSwitch && eight.calls == 2, "8 on one switch, 2 noisy pairs: " + v.checks);
  // Past kProbePassSeconds nothing is measured again: unclear.
  ModelledNetwork late = one;
  late.calls = 0;
  late.rounds_per_call.clear();
  v = Judge(late, kProbePassSeconds);
  Expect(v.kind == K::kUnclear && late.calls == 1, "no re-measure after the time: unclear");
  // Oversubscribed 2:1 (2 x 4 and 2 x 8): the slow directions stay slow
  // when measured again with their rounds' other flows, so never one
  // switch; measuring them alone would have found them fast.
  for (int n : {4, 8}) {
    std::vector<int> racks(2 * n);
    for (int i = 0; i < 2 * n; ++i) racks[i] = i / n;
    for (double ratio : {2.0, 3.0}) {
      ModelledNetwork over{racks, gbit, n * gbit / ratio};
      v = Judge(over);
      Expect(v.kind != K::kOneSwitch && over.calls >= 2,
             std::to_string(n) + " nodes a rack at " + std::to_string(ratio) +
                 ":1: not one switch after the re-measure: " + VerdictName(v.kind) + " " + v.checks);
    }
  }
  // Confirmation rounds: within each group, then one pairing per two groups.
  const std::vector<ProbeRound> rounds = ConfirmationRounds({0, 0, 1, 1, 1, 2});
  Expect(rounds.size() == 2 + 3 && rounds[0] == ProbeRound({1, 0, 3, 4, 2, -1}) &&
             rounds[1] == ProbeRound({-1, -1, 4, 2, 3, -1}) &&
             rounds[2] == ProbeRound({2, 3, 0, 1, -1, -1}) &&
             rounds[3] == ProbeRound({5, -1, -1, -1, -1, 0}) &&
             rounds[4] == ProbeRound({-1, -1, 5, -1, -1, 2}),
         "the confirmation rounds of groups of 2, 3 and 1");
}

// A receive's time (ProbeFlowSeconds), and the inflation it prevents:
// at 2 x 8 nodes behind 100 Mbit/s uplinks, the 256 KiB messages inside
// a rack arrive in one token-bucket burst, microseconds after whichever
// of sender and receiver started last.
void CheckProbeFlowSeconds() {
  using K = ProbeVerdict::Kind;
  const size_t bytes = 256 << 10, piece = bytes / kProbePieces;
  const double b = static_cast<double>(bytes), p = static_cast<double>(piece);
  auto near = [](double x, double y) { return std::abs(x - y) <= 1e-9 + 1e-6 * y; };
  // A flow a link limits from the round's start: its time as it was.
  Expect(near(ProbeFlowSeconds(bytes, piece, kProbePieces, p / 50e6, b / 50e6), b / 50e6),
         "a flow at its link's rate from the start keeps its time");
  // A sender 3 ms late on a 50 MB/s link: timed from the sender's start.
  const double late = 0.003;
  Expect(near(ProbeFlowSeconds(bytes, piece, kProbePieces, late + p / 50e6, late + b / 50e6),
              b / 50e6),
         "a late sender: timed from its start");
  // A burst: every piece within 0.1 ms of the start, or of a late sender.
  Expect(ProbeFlowSeconds(bytes, piece, kProbePieces, 0.00005, 0.0001) == kProbeShortestSeconds,
         "a burst at the round's start: the shortest time");
  Expect(near(ProbeFlowSeconds(bytes, piece, kProbePieces, 0.00605, 0.0061), 0.00305),
         "a burst after a sender 6 ms late: at most halved");
  // The rounds at distance 1 and K-1 send twice kProbeBytes, past a
  // 256 KB burst; other rounds, and sized rounds of more, as sized.
  const std::vector<ProbeRound> ring = RingRounds(16, {1, 2, 8, 15});
  Expect(ProbeRoundBytes(ring[0], bytes) == 2 * kProbeBytes &&
             ProbeRoundBytes(ring[3], bytes) == 2 * kProbeBytes &&
             ProbeRoundBytes(ring[1], bytes) == bytes && ProbeRoundBytes(ring[2], bytes) == bytes &&
             ProbeRoundBytes(ring[0], 4 * kProbeBytes) == 4 * kProbeBytes &&
             ProbeRoundBytes(ConfirmationRounds({0, 0, 0, 0, 1, 1, 1, 1})[0], bytes) == bytes,
         "the rounds at distance 1 and K-1 send past the burst");
  // 2 x 8 at 400/100 Mbit/s, every flow inside a rack a burst after its
  // sender's start, 0 to 0.4 ms late, and 4.5 ms late from nodes 3 and 12
  // (they lost their cores); the flows across at their uplink's share.
  ProbeRates timed = TwoRacks(8, 50e6, 12.5e6), raw = timed;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      if (i == j || i / 8 != j / 8) continue;
      const double skew = i == 3 || i == 12 ? 0.0045 : 0.0001 * ((7 * i + 3 * j) % 5);
      timed[i][j] = b / ProbeFlowSeconds(bytes, piece, kProbePieces, skew + 0.00005, skew + 0.0001);
      raw[i][j] = b / ((skew + 0.0001) / 2);  // the time halved, as before the shortest time
    }
  }
  ProbeVerdict v = ClassifyProbeRates(raw);
  Expect(v.kind != K::kRacks, std::string("bursts read as they are: not the racks (") +
                                  VerdictName(v.kind) + ": " + v.reason + ")");
  v = ClassifyProbeRates(timed);
  std::vector<int> halves(16);
  for (int n = 0; n < 16; ++n) halves[n] = n / 8;
  Expect(v.kind == K::kRacks && v.group_of_node == halves,
         "bursts at the shortest time: the racks " + v.reason);
}

// The measurement on threads as ranks: 4 nodes x 2 ranks, the nodes'
// first ranks as leaders. The rates are whatever threads reach, so only
// the agreement is checked: every rank holds rank 0's verdict, with a
// group for every node.
void CheckProbeAgreement() {
  const int nodes = 4, per_node = 2, n = nodes * per_node;
  InProcessGroup world(n, 1 << 16), leaders(nodes, 1 << 16);
  std::vector<ProbeVerdict> got(n);
  world.Run([&](int r) {
    InProcessRank all(world, r);
    std::unique_ptr<InProcessRank> leader;
    if (r % per_node == 0) leader = std::make_unique<InProcessRank>(leaders, r / per_node);
    got[r] = ProbeRacks(all, leader.get(), {0, 2, 4, 6});
  });
  for (int r = 0; r < n; ++r) {
    Expect(got[r].kind == got[0].kind && got[r].group_of_node == got[0].group_of_node &&
               got[r].reason == got[0].reason && got[r].group_of_node.size() == nodes,
           "rank " + std::to_string(r) + " holds rank 0's probe verdict");
  }
}

}  // namespace

int main() {
  CheckDetect();
  CheckAgreement();
  CheckProbeVerdicts();
  CheckProbeJudge();
  CheckProbeFlowSeconds();
  CheckProbeAgreement();
  return ddl_test::Summary();
}
