#include "topology_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "../common/util.h"
#include "../transport/tags.h"

namespace ddl {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The slower direction of the pair (i, j).
double PairRate(const std::vector<std::vector<double>>& rate, int i, int j) {
  return std::min(rate[i][j], rate[j][i]);
}

int Find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

std::string Format(const char* fmt, double v) {
  char text[64];
  std::snprintf(text, sizeof text, fmt, v);
  return text;
}

// One round at distance d: this leader sends `bytes` to the node d places
// on and receives as much from the node d places before, every leader at
// once; returns the seconds its receive took from the round's start.
double Round(Group& leaders, int d, size_t bytes, std::vector<char>& out, std::vector<char>& in) {
  const int k = leaders.size();
  const int me = leaders.rank();
  const size_t piece = std::max<size_t>(1, std::min(bytes, leaders.MaxMessageBytes()));
  // Every node starts the round together, so the flows overlap.
  leaders.AllgatherInt64(d);
  const auto start = Clock::now();
  std::vector<Transport::Handle> receives, sends;
  for (size_t at = 0; at < bytes; at += piece) {
    receives.push_back(leaders.Irecv(in.data() + at, std::min(piece, bytes - at), (me - d + k) % k,
                                     kTagProbe));
  }
  for (size_t at = 0; at < bytes; at += piece) {
    sends.push_back(
        leaders.Isend(out.data() + at, std::min(piece, bytes - at), (me + d) % k, kTagProbe));
  }
  for (Transport::Handle h : receives) leaders.Wait(h);
  const double seconds = std::max(SecondsSince(start), 1e-9);
  for (Transport::Handle h : sends) leaders.Wait(h);
  return seconds;
}

// The bytes of every round: doubled from kProbeBytes until the slowest
// receive of a round at distance K/2 takes kProbeRoundSeconds. Long
// rounds time the links rather than the messages' fixed costs and the
// moments the receivers leave the round's start (milliseconds where ranks
// share cores). The round at distance K/2 is the one where, with racks
// listed rack by rack, every flow crosses an uplink: sized by it, the
// rounds stay short behind slow uplinks (2 racks x 8 nodes behind
// 100 Mbit/s: 256 KiB, where the round at distance 1, one flow across and
// a token bucket's burst, doubled to 512 KiB and the pass to 2.7 s), and
// on one switch it is a round like any other.
size_t RoundBytes(Group& leaders, std::vector<char>& out, std::vector<char>& in) {
  const int farthest = std::max(1, leaders.size() / 2);
  size_t bytes = kProbeBytes;
  for (;;) {
    out.assign(bytes, 1);
    in.resize(bytes);
    const double seconds = Round(leaders, farthest, bytes, out, in);
    std::vector<int64_t> all = leaders.AllgatherInt64(static_cast<int64_t>(seconds * 1e6));
    const int64_t slowest = *std::max_element(all.begin(), all.end());
    if (slowest >= static_cast<int64_t>(kProbeRoundSeconds * 1e6) || bytes >= kProbeMaxBytes) {
      return bytes;
    }
    bytes *= 2;
  }
}

// rate[from][to] from every leader's row of rates from each node (rank 0
// of the leaders; empty elsewhere).
std::vector<std::vector<double>> RateMatrix(const std::vector<std::vector<char>>& gathered,
                                            int k) {
  std::vector<std::vector<double>> rate(k, std::vector<double>(k, 0.0));
  for (int to = 0; to < k && to < static_cast<int>(gathered.size()); ++to) {
    if (gathered[to].size() < static_cast<size_t>(k) * sizeof(double)) continue;
    for (int from = 0; from < k; ++from) {
      std::memcpy(&rate[from][to], gathered[to].data() + from * sizeof(double), sizeof(double));
    }
  }
  return rate;
}

// The median pair rate within groups (0 with no pair within) and the
// fastest pair across them. The median, so that a pair within that lost a
// pass to a busy core does not undo the grouping.
struct GroupRates {
  double typical_within = 0;
  double fastest_across = 0;
};

GroupRates RatesOfGroups(const std::vector<std::vector<double>>& rate,
                         const std::vector<int>& group_of_node) {
  std::vector<double> within;
  GroupRates g;
  const int k = static_cast<int>(rate.size());
  for (int i = 0; i < k; ++i) {
    for (int j = i + 1; j < k; ++j) {
      const double p = PairRate(rate, i, j);
      if (group_of_node[i] == group_of_node[j]) {
        within.push_back(p);
      } else {
        g.fastest_across = std::max(g.fastest_across, p);
      }
    }
  }
  if (!within.empty()) {
    std::nth_element(within.begin(), within.begin() + within.size() / 2, within.end());
    g.typical_within = within[within.size() / 2];
  }
  return g;
}

// A verdict after the first pass that a second could not change: one
// switch (a busy core only slows pairs, so every pair fast stays fast), or
// racks with the pairs across at most a third of the median within.
bool Settled(const std::vector<std::vector<double>>& rate, const ProbeVerdict& v) {
  if (v.kind == ProbeVerdict::kOneSwitch) return true;
  if (v.kind != ProbeVerdict::kRacks) return false;
  const GroupRates g = RatesOfGroups(rate, v.group_of_node);
  return g.fastest_across <= g.typical_within / 3;
}

}  // namespace

const char* VerdictName(ProbeVerdict::Kind kind) {
  return kind == ProbeVerdict::kRacks       ? "racks"
         : kind == ProbeVerdict::kOneSwitch ? "one switch"
                                            : "unclear";
}

ProbeVerdict ClassifyProbeRates(const std::vector<std::vector<double>>& rate) {
  const int k = static_cast<int>(rate.size());
  ProbeVerdict v;
  v.group_of_node.assign(k, 0);
  if (k < 2) {
    v.kind = ProbeVerdict::kOneSwitch;
    v.reason = "one node";
    return v;
  }
  std::vector<double> pairs;
  for (int i = 0; i < k; ++i) {
    for (int j = i + 1; j < k; ++j) pairs.push_back(PairRate(rate, i, j));
  }
  std::vector<double> sorted = pairs;
  std::sort(sorted.begin(), sorted.end());
  // The fastest tenth's rate: what a pair reaches when nothing holds it
  // back (the median would be an uplink's share with most pairs across).
  const double top = sorted[static_cast<size_t>(0.9 * static_cast<double>(sorted.size() - 1))];
  const double fast = kProbeLinkShare * top;
  const double median = sorted[sorted.size() / 2];
  std::vector<int> parent(k);
  std::iota(parent.begin(), parent.end(), 0);
  bool all_fast = true;
  for (int i = 0; i < k; ++i) {
    for (int j = i + 1; j < k; ++j) {
      if (PairRate(rate, i, j) >= fast) {
        parent[Find(parent, j)] = Find(parent, i);
      } else {
        all_fast = false;
      }
    }
  }
  if (all_fast && sorted.front() >= kProbeOneSwitchShare * median) {
    v.kind = ProbeVerdict::kOneSwitch;
    v.reason = "every pair reached half the fastest tenth's rate and 2/3 of the median pair's";
    return v;
  }
  // Groups numbered by their lowest node.
  std::vector<int> number(k, -1);
  int groups = 0;
  for (int i = 0; i < k; ++i) {
    const int root = Find(parent, i);
    if (number[root] < 0) number[root] = groups++;
    v.group_of_node[i] = number[root];
  }
  std::vector<int> size(groups, 0);
  for (int g : v.group_of_node) ++size[g];
  // A group is a rack when the pairs across groups are clearly slower than
  // the typical pair within one.
  const GroupRates g = RatesOfGroups(rate, v.group_of_node);
  const double typical_within = g.typical_within;
  const double fastest_across = g.fastest_across;
  const bool alone = *std::min_element(size.begin(), size.end()) < 2;
  if (groups < 2 || alone || fastest_across > typical_within * 2.0 / 3.0) {
    v.kind = ProbeVerdict::kUnclear;
    v.reason = groups < 2 ? "some pairs are slow, but they do not split the nodes into groups"
               : alone    ? "a node is slow to every other node"
                          : "a pair across groups is as fast as 2/3 of the median pair within";
    return v;
  }
  v.kind = ProbeVerdict::kRacks;
  v.reason = "every pair across groups is at most 2/3 as fast as the median pair within";
  return v;
}

std::string DescribeProbe(const std::vector<std::vector<double>>& rate,
                          const ProbeVerdict& verdict, const std::vector<int>& first_rank_of_node,
                          size_t bytes, double seconds) {
  const int k = static_cast<int>(rate.size());
  std::string out = "keras_ddl topology probe: " + std::to_string(k) + " nodes, " +
                    std::to_string(std::max(k - 1, 0)) + " rounds, up to " +
                    std::to_string(kProbePasses) + " passes (in round d every node sends " +
                    std::to_string(bytes >> 10) +
                    " KiB to the node d places on, all at once), " + Format("%.2f", seconds) +
                    " s in all; pair rate = the slower direction of its faster pass\n";
  auto pad = [](std::string s, size_t w) {
    s.resize(std::max(w, s.size()), ' ');
    return s;
  };
  auto trimmed = [](const std::string& row) {
    return row.substr(0, row.find_last_not_of(' ') + 1) + "\n";
  };
  out += "  " + pad("group", 8) + pad("nodes", 7) + pad("ranks (first of each node)", 28) +
         pad("median pair within", 20) + "fastest pair across\n";
  const int groups = k == 0 ? 0 : *std::max_element(verdict.group_of_node.begin(),
                                                    verdict.group_of_node.end()) + 1;
  auto rate_text = [](double r) { return r < 0 ? std::string("-") : Format("%7.1f MB/s", r); };
  for (int g = 0; g < groups; ++g) {
    std::vector<int> ranks;
    std::vector<double> within;
    double across = -1;
    for (int i = 0; i < k; ++i) {
      if (verdict.group_of_node[i] != g) continue;
      ranks.push_back(first_rank_of_node[i]);
      for (int j = 0; j < k; ++j) {
        if (j == i) continue;
        const double p = PairRate(rate, i, j) / 1e6;
        if (verdict.group_of_node[j] == g) {
          if (j > i) within.push_back(p);
        } else {
          across = std::max(across, p);
        }
      }
    }
    std::nth_element(within.begin(), within.begin() + within.size() / 2, within.end());
    out += trimmed("  " + pad("probe" + std::to_string(g + 1), 8) +
                   pad(std::to_string(ranks.size()), 7) + pad(RankRuns(ranks), 28) +
                   pad(rate_text(within.empty() ? -1 : within[within.size() / 2]), 20) +
                   rate_text(across));
  }
  // Every pair, while the rows stay readable.
  if (k <= 16) {
    out += "  pair rates in MB/s, from each node (row) to each node (column):\n";
    std::string head = "  " + pad("", 14);
    for (int j = 0; j < k; ++j) head += Format("%6.0f", static_cast<double>(j));
    out += trimmed(head);
    for (int i = 0; i < k; ++i) {
      std::string row = "  " + pad("node " + std::to_string(i) + " (p" +
                                       std::to_string(verdict.group_of_node[i] + 1) + ")", 14);
      for (int j = 0; j < k; ++j) row += i == j ? "     -" : Format("%6.0f", rate[i][j] / 1e6);
      out += trimmed(row);
    }
  }
  out += std::string("  verdict: ") + VerdictName(verdict.kind) + " (" + verdict.reason + ")\n";
  return out;
}

void ApplyProbeVerdict(const ProbeVerdict& v, Topology* t) {
  const int nodes = static_cast<int>(t->rack_of_node.size());
  const bool racks = v.kind == ProbeVerdict::kRacks;
  const int groups = racks ? *std::max_element(v.group_of_node.begin(), v.group_of_node.end()) + 1
                           : 1;
  t->source = "probe";
  t->racks.clear();
  for (int g = 0; g < groups; ++g) t->racks.push_back(racks ? "probe" + std::to_string(g + 1) : "");
  for (int n = 0; n < nodes; ++n) t->rack_of_node[n] = racks ? v.group_of_node[n] : 0;
  for (size_t r = 0; r < t->rack_of_rank.size(); ++r) {
    t->rack_of_rank[r] = t->rack_of_node[t->node_of_rank[r]];
  }
  std::vector<int> in(groups, 0);
  for (int g : t->rack_of_node) ++in[g];
  t->nodes_per_rack = std::all_of(in.begin(), in.end(), [&](int k) { return k == in[0]; }) ? in[0] : 0;
  t->uncertain = v.kind == ProbeVerdict::kUnclear;
  t->probe_seconds = v.seconds;
  t->probe_verdict = VerdictName(v.kind);
  t->probe_reason = v.reason;
}

ProbeVerdict ProbeRacks(Group& world, Group* leaders, const std::vector<int>& first_rank_of_node,
                        bool print) {
  const auto start = Clock::now();
  const int k = static_cast<int>(first_rank_of_node.size());
  size_t bytes = kProbeBytes;
  ProbeVerdict verdict;
  std::vector<std::vector<double>> rate;  // rank 0's
  if (leaders != nullptr && k > 1) {
    std::vector<char> out, in;
    bytes = RoundBytes(*leaders, out, in);
    const int me = leaders->rank();
    std::vector<double> from(k, 0.0);
    // Every distance, up to kProbePasses times; a pair keeps its fastest
    // pass (a rank that lost its core for a moment slows one pass, a
    // shared uplink every pass). Rank 0 decides after each pass whether
    // another could change the verdict, and tells the leaders.
    for (int pass = 0; pass < kProbePasses; ++pass) {
      for (int d = 1; d < k; ++d) {
        const int source = (me - d + k) % k;
        from[source] =
            std::max(from[source], static_cast<double>(bytes) / Round(*leaders, d, bytes, out, in));
      }
      std::vector<char> mine(from.size() * sizeof(double));
      std::memcpy(mine.data(), from.data(), mine.size());
      const std::vector<std::vector<char>> gathered = leaders->GatherBytes(mine, 0);
      std::vector<char> done(1, 0);
      if (me == 0) {
        rate = RateMatrix(gathered, k);
        verdict = ClassifyProbeRates(rate);
        done[0] = pass + 1 == kProbePasses || Settled(rate, verdict) ||
                  SecondsSince(start) >= kProbePassSeconds;
      }
      leaders->BroadcastBytes(done, 0);
      if (done.at(0)) break;
    }
  } else if (k == 1) {
    rate.assign(1, std::vector<double>(1, 0.0));
    verdict = ClassifyProbeRates(rate);
  }
  // Rank 0 (node 0's leader) prints and sends every rank the same bytes:
  // the kind, each node's group, the reason.
  std::vector<char> decision;
  if (world.rank() == 0) {
    const ProbeVerdict& v = verdict;
    const double seconds = SecondsSince(start);
    if (print) {
      std::fputs(DescribeProbe(rate, v, first_rank_of_node, bytes, seconds).c_str(), stderr);
    }
    std::vector<int32_t> words = {static_cast<int32_t>(v.kind)};
    words.insert(words.end(), v.group_of_node.begin(), v.group_of_node.end());
    decision.resize(words.size() * sizeof(int32_t) + sizeof(double));
    std::memcpy(decision.data(), words.data(), words.size() * sizeof(int32_t));
    std::memcpy(decision.data() + words.size() * sizeof(int32_t), &seconds, sizeof(double));
    decision.insert(decision.end(), v.reason.begin(), v.reason.end());
  }
  world.BroadcastBytes(decision, 0);
  std::vector<int32_t> words(1 + k);
  const size_t head = words.size() * sizeof(int32_t) + sizeof(double);
  if (decision.size() < head) throw TransportError("the topology probe's verdict arrived truncated");
  std::memcpy(words.data(), decision.data(), words.size() * sizeof(int32_t));
  ProbeVerdict v;
  v.kind = static_cast<ProbeVerdict::Kind>(words[0]);
  v.group_of_node.assign(words.begin() + 1, words.end());
  std::memcpy(&v.seconds, decision.data() + words.size() * sizeof(int32_t), sizeof(double));
  v.reason.assign(decision.begin() + head, decision.end());
  return v;
}

}  // namespace ddl
