// Topology detection (engine/topology.h): reading DDL_TOPOLOGY and Slurm's
// SLURM_TOPOLOGY_ADDR from a given environment, and the agreement over
// threads as ranks (tests/core/in_process.h): the racks and nodes every
// rank ends with, and for ranks that disagree, the same error on every
// rank naming the ranks and what each saw. Prints "<N> checks, <F> failures".
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "engine/topology.h"
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
             got[3].second.Describe() == "one switch: 4 node(s)",
         "no topology: one switch; " + got[3].second.Describe());
}

}  // namespace

int main() {
  CheckDetect();
  CheckAgreement();
  return ddl_test::Summary();
}
