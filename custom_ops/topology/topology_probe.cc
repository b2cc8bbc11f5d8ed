#include "topology_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <utility>

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

// One round: this leader sends `bytes` to node `to` and receives as much
// from node `from` (either -1 for none), every leader at once; returns
// the seconds its receive took (-1 without one), from the round's start
// or, when the sender started late, from when it started.
//
// Ranks leave the round's opening allgather at different moments (its
// waits nap while ranks share cores), so a sender may start milliseconds
// after its receiver, and timed from the receiver's start alone the pair
// looks slower than its link, in every pass alike. So the message comes
// in kProbePieces pieces: the pieces after the first time the flow's rate,
// and the sender's start is estimated as the first piece's arrival less
// one piece at that rate (the time at most halved). A flow that shares an
// uplink moves at its share from the start, so its estimate is the
// round's start and its time is what it was.
double Round(Group& leaders, int to, int from, size_t bytes, std::vector<char>& out,
             std::vector<char>& in) {
  const size_t piece = std::max<size_t>(
      1, std::min((bytes + kProbePieces - 1) / kProbePieces, leaders.MaxMessageBytes()));
  // Every node starts the round together, so the flows overlap.
  leaders.AllgatherInt64(to);
  const auto start = Clock::now();
  std::vector<Transport::Handle> receives, sends;
  for (size_t at = 0; from >= 0 && at < bytes; at += piece) {
    receives.push_back(leaders.Irecv(in.data() + at, std::min(piece, bytes - at), from, kTagProbe));
  }
  for (size_t at = 0; to >= 0 && at < bytes; at += piece) {
    sends.push_back(leaders.Isend(out.data() + at, std::min(piece, bytes - at), to, kTagProbe));
  }
  double first = 0;  // seconds from the start to the first piece
  for (size_t i = 0; i < receives.size(); ++i) {
    leaders.Wait(receives[i]);
    if (i == 0) first = SecondsSince(start);
  }
  const double seconds =
      from >= 0 ? ProbeFlowSeconds(bytes, std::min(piece, bytes), receives.size(), first,
                                   SecondsSince(start))
                : -1.0;
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
    const int k = leaders.size(), me = leaders.rank();
    const double seconds =
        Round(leaders, (me + farthest) % k, (me - farthest + k) % k, bytes, out, in);
    std::vector<int64_t> all = leaders.AllgatherInt64(static_cast<int64_t>(seconds * 1e6));
    const int64_t slowest = *std::max_element(all.begin(), all.end());
    if (slowest >= static_cast<int64_t>(kProbeRoundSeconds * 1e6) || bytes >= kProbeMaxBytes) {
      return bytes;
    }
    bytes *= 2;
  }
}

// rate[from][to] from every leader's row of rates from each node (-1 for
// a node it did not hear from in the rounds).
std::vector<std::vector<double>> RateMatrix(const std::vector<std::vector<char>>& gathered,
                                            int k) {
  std::vector<std::vector<double>> rate(k, std::vector<double>(k, -1.0));
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
      if (p < 0) continue;  // not measured
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

// The rates every measured pair must reach for one switch: half the
// fastest tenth's and kProbeOneSwitchShare of the median pair's.
struct PairBars {
  double fast = 0;        // kProbeLinkShare of the fastest tenth
  double one_switch = 0;  // the larger of `fast` and the median's share
  double median = 0;
  bool any = false;       // a pair was measured
};

PairBars BarsOf(const ProbeRates& rate) {
  const int k = static_cast<int>(rate.size());
  std::vector<double> sorted;
  for (int i = 0; i < k; ++i) {
    for (int j = i + 1; j < k; ++j) {
      if (PairRate(rate, i, j) >= 0) sorted.push_back(PairRate(rate, i, j));
    }
  }
  PairBars b;
  if (sorted.empty()) return b;
  std::sort(sorted.begin(), sorted.end());
  // The fastest tenth's rate: what a pair reaches when nothing holds it
  // back (the median would be an uplink's share with most pairs across).
  const double top = sorted[static_cast<size_t>(0.9 * static_cast<double>(sorted.size() - 1))];
  b.fast = kProbeLinkShare * top;
  b.median = sorted[sorted.size() / 2];
  b.one_switch = std::max(b.fast, kProbeOneSwitchShare * b.median);
  b.any = true;
  return b;
}

// "nodes 0, 2 | 1, 3 | 4-7": the groups of a partition, by node.
std::string GroupsText(const std::vector<int>& group_of_node) {
  if (group_of_node.empty()) return "none";
  const int groups = *std::max_element(group_of_node.begin(), group_of_node.end()) + 1;
  std::string out = "nodes ";
  for (int g = 0; g < groups; ++g) {
    std::vector<int> nodes;
    for (int n = 0; n < static_cast<int>(group_of_node.size()); ++n) {
      if (group_of_node[n] == g) nodes.push_back(n);
    }
    out += (g ? " | " : "") + RankRuns(nodes);
  }
  return out;
}

// Keeps, for every direction measured in `again`, the faster of it and
// `rate` (the re-measure's rule: noise only slows a flow).
void KeepFaster(const ProbeRates& again, ProbeRates* rate) {
  for (size_t i = 0; i < rate->size(); ++i) {
    for (size_t j = 0; j < rate->size(); ++j) {
      if (i != j && again[i][j] >= 0) (*rate)[i][j] = std::max((*rate)[i][j], again[i][j]);
    }
  }
}

}  // namespace

double ProbeFlowSeconds(size_t bytes, size_t first_bytes, size_t pieces, double first,
                        double seconds) {
  seconds = std::max(seconds, 1e-9);
  const double rest = seconds - first;
  if (pieces > 1 && rest > 0) {
    const double rate = static_cast<double>(bytes - first_bytes) / rest;
    const double sender_start = first - static_cast<double>(first_bytes) / rate;
    // At most halved: pieces that arrive in one burst (a token bucket's,
    // or all at once after a nap of this rank) give no rate to trust.
    if (sender_start > 0) seconds = std::max(seconds - sender_start, seconds / 2);
  }
  // A message that arrived within kProbeShortestSeconds came in a burst
  // or had arrived before its receiver started: either way its time is not
  // its link's, and read as it is it would put one pair of a rack ten or
  // a hundred times above another (see kProbeShortestSeconds).
  return std::max(seconds, kProbeShortestSeconds);
}

size_t ProbeRoundBytes(const ProbeRound& round, size_t bytes) {
  const int k = static_cast<int>(round.size());
  bool next = k > 1, previous = k > 1;
  for (int n = 0; n < k; ++n) {
    next = next && round[n] == (n + 1) % k;
    previous = previous && round[n] == (n + k - 1) % k;
  }
  return next || previous ? std::max(bytes, 2 * kProbeBytes) : bytes;
}

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
  const PairBars bars = BarsOf(rate);
  if (!bars.any) {
    v.reason = "no pair was measured";
    return v;
  }
  std::vector<int> parent(k);
  std::iota(parent.begin(), parent.end(), 0);
  bool one_switch = true;
  for (int i = 0; i < k; ++i) {
    for (int j = i + 1; j < k; ++j) {
      const double p = PairRate(rate, i, j);
      if (p < 0) continue;  // not measured
      if (p >= bars.fast) parent[Find(parent, j)] = Find(parent, i);
      if (p < bars.one_switch) one_switch = false;
    }
  }
  if (one_switch) {
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

std::vector<ProbeRound> RingRounds(int k, const std::vector<int>& distances) {
  std::vector<ProbeRound> rounds;
  for (int d : distances) {
    ProbeRound r(k);
    for (int n = 0; n < k; ++n) r[n] = (n + d) % k;
    rounds.push_back(r);
  }
  return rounds;
}

std::vector<ProbeRound> ConfirmationRounds(const std::vector<int>& group_of_node) {
  const int k = static_cast<int>(group_of_node.size());
  const int groups =
      k == 0 ? 0 : *std::max_element(group_of_node.begin(), group_of_node.end()) + 1;
  std::vector<std::vector<int>> members(groups);
  for (int n = 0; n < k; ++n) members[group_of_node[n]].push_back(n);
  size_t largest = 0;
  for (const auto& m : members) largest = std::max(largest, m.size());
  std::vector<ProbeRound> rounds;
  // Within: distance d inside every group larger than d (d < its size,
  // so each ordered pair once).
  for (size_t d = 1; d < largest; ++d) {
    ProbeRound r(k, -1);
    for (const auto& m : members) {
      for (size_t i = 0; d < m.size() && i < m.size(); ++i) r[m[i]] = m[(i + d) % m.size()];
    }
    rounds.push_back(r);
  }
  // Across: each two groups, their members paired in order, both ways.
  for (int g = 0; g < groups; ++g) {
    for (int h = g + 1; h < groups; ++h) {
      ProbeRound r(k, -1);
      for (size_t i = 0; i < std::min(members[g].size(), members[h].size()); ++i) {
        r[members[g][i]] = members[h][i];
        r[members[h][i]] = members[g][i];
      }
      rounds.push_back(r);
    }
  }
  return rounds;
}

ProbeVerdict JudgeProbe(int k, const MeasureRounds& measure,
                        const std::function<double()>& seconds_so_far, ProbeRates* first_rates) {
  int rounds = 0;
  auto run = [&](const std::vector<ProbeRound>& plan) {
    rounds += static_cast<int>(plan.size());
    return measure(plan);
  };
  std::vector<int> every(std::max(k - 1, 0));
  std::iota(every.begin(), every.end(), 1);
  ProbeRates rate = run(RingRounds(k, every));
  ProbeVerdict v = ClassifyProbeRates(rate);
  std::string checks;
  // Step 2: the rounds that held a slow direction, once more, whole.
  if (v.kind == ProbeVerdict::kUnclear && seconds_so_far() < kProbePassSeconds) {
    const PairBars bars = BarsOf(rate);
    // The directions below the bar, and by distance the rounds that held them.
    std::vector<std::pair<int, int>> slow;
    std::vector<bool> again(k, false);
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < k; ++j) {
        if (i != j && rate[i][j] >= 0 && rate[i][j] < bars.one_switch) {
          slow.emplace_back(i, j);
          again[(j - i + k) % k] = true;
        }
      }
    }
    std::vector<int> distances;
    for (int d = 1; d < k; ++d) {
      if (again[d]) distances.push_back(d);
    }
    if (!distances.empty()) {
      const ProbeRates second = run(RingRounds(k, distances));
      // Only the slow directions take the faster of two: the others keep
      // the first pass's, so the bars move no more than the slow pairs do.
      ProbeRates slow_only(k, std::vector<double>(k, -1.0));
      for (const auto& [i, j] : slow) slow_only[i][j] = second[i][j];
      KeepFaster(slow_only, &rate);
      const ProbeVerdict before = v;
      v = ClassifyProbeRates(rate);
      checks = std::to_string(slow.size()) + " direction(s) below the one-switch bar measured again in " +
               std::to_string(distances.size()) + " round(s), each keeping its faster: " +
               (v.kind == before.kind ? std::string("still ") : std::string("now ")) +
               VerdictName(v.kind);
    }
  }
  if (first_rates != nullptr) *first_rates = rate;
  // Step 3: racks only when an independent pass finds the same partition.
  if (v.kind == ProbeVerdict::kRacks) {
    std::vector<int> proposal = v.group_of_node;
    std::string history = "the first pass found " + GroupsText(proposal);
    for (int attempt = 1; attempt <= kProbeConfirmations; ++attempt) {
      const std::vector<ProbeRound> plan = ConfirmationRounds(proposal);
      const ProbeVerdict c = ClassifyProbeRates(run(plan));
      const std::string pass = attempt == 1 ? "a second pass" : "a third pass";
      if (c.kind == ProbeVerdict::kRacks && c.group_of_node == proposal) {
        v.group_of_node = proposal;
        v.confirmed = true;
        v.checks = (checks.empty() ? "" : checks + "; ") + "confirmed: " + pass + " (" +
                   std::to_string(plan.size()) + " rounds: every pair within a group, one " +
                   "pairing across each two groups) found the same racks" +
                   (attempt == 1 ? "" : " (" + history + ")");
        v.rounds = rounds;
        return v;
      }
      history += ", " + pass + " found " +
                 (c.kind == ProbeVerdict::kRacks ? GroupsText(c.group_of_node)
                                                 : std::string(VerdictName(c.kind)) + " (" +
                                                       c.reason + ")");
      if (c.kind != ProbeVerdict::kRacks) break;
      proposal = c.group_of_node;
    }
    v.kind = ProbeVerdict::kUnclear;
    v.reason = "racks not confirmed by a second pass";
    v.checks = (checks.empty() ? "" : checks + "; ") + "unconfirmed: " + history;
    v.rounds = rounds;
    return v;
  }
  v.checks = checks;
  v.rounds = rounds;
  return v;
}

std::string DescribeProbe(const std::vector<std::vector<double>>& rate,
                          const ProbeVerdict& verdict, const std::vector<int>& first_rank_of_node,
                          size_t bytes, double seconds) {
  const int k = static_cast<int>(rate.size());
  std::string out = "keras_ddl topology probe: " + std::to_string(k) + " nodes, " +
                    std::to_string(std::max(k - 1, 0)) + " rounds in the first pass, " +
                    std::to_string(verdict.rounds) + " in all (in round d of the first " +
                    "pass every node sends " + std::to_string(bytes >> 10) +
                    " KiB to the node d places on, all at once), " + Format("%.2f", seconds) +
                    " s in all; pair rate = the slower direction (a slow direction measured "
                    "again keeps its faster)\n";
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
      for (int j = 0; j < k; ++j) {
        row += i == j || rate[i][j] < 0 ? "     -" : Format("%6.0f", rate[i][j] / 1e6);
      }
      out += trimmed(row);
    }
  }
  out += std::string("  verdict: ") + VerdictName(verdict.kind) + " (" + verdict.reason + ")\n";
  if (!verdict.checks.empty()) out += "  checked: " + verdict.checks + "\n";
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
  t->probe_checks = v.checks;
  t->probe_confirmed = v.confirmed;
}

namespace {

// A plan of rounds as the leaders send it: the round count, then each
// round's send_to per node.
std::vector<char> PlanBytes(const std::vector<ProbeRound>& plan) {
  std::vector<int32_t> words = {static_cast<int32_t>(plan.size())};
  for (const ProbeRound& r : plan) words.insert(words.end(), r.begin(), r.end());
  std::vector<char> bytes(words.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

std::vector<ProbeRound> PlanOf(const std::vector<char>& bytes, int k) {
  std::vector<int32_t> words(bytes.size() / sizeof(int32_t));
  std::memcpy(words.data(), bytes.data(), words.size() * sizeof(int32_t));
  if (words.empty() || words.size() != 1 + static_cast<size_t>(words[0]) * k) {
    throw TransportError("the topology probe's plan of rounds arrived truncated");
  }
  std::vector<ProbeRound> plan(words[0]);
  for (int32_t r = 0; r < words[0]; ++r) {
    plan[r].assign(words.begin() + 1 + r * k, words.begin() + 1 + (r + 1) * k);
  }
  return plan;
}

// This leader's part of a plan: each round in turn; returns the rate from
// each node (-1 for a node it did not hear from; the faster of two).
std::vector<double> RunPlan(Group& leaders, const std::vector<ProbeRound>& plan, size_t bytes,
                            std::vector<char>& out, std::vector<char>& in) {
  const int k = leaders.size(), me = leaders.rank();
  std::vector<double> from(k, -1.0);
  for (const ProbeRound& r : plan) {
    int source = -1;
    for (int n = 0; n < k; ++n) {
      if (r[n] == me) source = n;
    }
    const size_t round_bytes = ProbeRoundBytes(r, bytes);
    if (out.size() < round_bytes) out.assign(round_bytes, 1);
    if (in.size() < round_bytes) in.resize(round_bytes);
    const double seconds = Round(leaders, r[me], source, round_bytes, out, in);
    if (source >= 0) {
      from[source] = std::max(from[source], static_cast<double>(round_bytes) / seconds);
    }
  }
  return from;
}

}  // namespace

ProbeVerdict ProbeRacks(Group& world, Group* leaders, const std::vector<int>& first_rank_of_node,
                        bool print) {
  const auto start = Clock::now();
  const int k = static_cast<int>(first_rank_of_node.size());
  size_t bytes = kProbeBytes;
  ProbeVerdict verdict;
  ProbeRates rate;  // rank 0's
  if (leaders != nullptr && k > 1) {
    std::vector<char> out, in;
    bytes = RoundBytes(*leaders, out, in);
    // Leader 0 judges and sends every plan of rounds to the others, which
    // run it and send back their rates; an empty plan ends the probe.
    auto run = [&](const std::vector<ProbeRound>& plan) {
      const std::vector<double> from = RunPlan(*leaders, plan, bytes, out, in);
      std::vector<char> mine(from.size() * sizeof(double));
      std::memcpy(mine.data(), from.data(), mine.size());
      return leaders->GatherBytes(mine, 0);
    };
    if (leaders->rank() == 0) {
      const MeasureRounds measure = [&](const std::vector<ProbeRound>& plan) {
        std::vector<char> sent = PlanBytes(plan);
        leaders->BroadcastBytes(sent, 0);
        return RateMatrix(run(plan), k);
      };
      verdict = JudgeProbe(k, measure, [&] { return SecondsSince(start); }, &rate);
      std::vector<char> end = PlanBytes({});
      leaders->BroadcastBytes(end, 0);
    } else {
      for (;;) {  // until leader 0's empty plan (at most a few plans)
        std::vector<char> got;
        leaders->BroadcastBytes(got, 0);
        const std::vector<ProbeRound> plan = PlanOf(got, k);
        if (plan.empty()) break;
        run(plan);
      }
    }
  } else if (k == 1) {
    rate.assign(1, std::vector<double>(1, 0.0));
    verdict = ClassifyProbeRates(rate);
  }
  // Rank 0 (node 0's leader) prints and sends every rank the same bytes:
  // the kind, whether confirmed, the rounds, each node's group, the
  // seconds, the reason and the checks (split by a NUL).
  std::vector<char> decision;
  if (world.rank() == 0) {
    const ProbeVerdict& v = verdict;
    const double seconds = SecondsSince(start);
    if (print) {
      std::fputs(DescribeProbe(rate, v, first_rank_of_node, bytes, seconds).c_str(), stderr);
    }
    std::vector<int32_t> words = {static_cast<int32_t>(v.kind), v.confirmed ? 1 : 0, v.rounds};
    words.insert(words.end(), v.group_of_node.begin(), v.group_of_node.end());
    decision.resize(words.size() * sizeof(int32_t) + sizeof(double));
    std::memcpy(decision.data(), words.data(), words.size() * sizeof(int32_t));
    std::memcpy(decision.data() + words.size() * sizeof(int32_t), &seconds, sizeof(double));
    decision.insert(decision.end(), v.reason.begin(), v.reason.end());
    decision.push_back('\0');
    decision.insert(decision.end(), v.checks.begin(), v.checks.end());
  }
  world.BroadcastBytes(decision, 0);
  std::vector<int32_t> words(3 + k);
  const size_t head = words.size() * sizeof(int32_t) + sizeof(double);
  const auto nul = std::find(decision.begin() + std::min(head, decision.size()), decision.end(), '\0');
  if (decision.size() < head || nul == decision.end()) {
    throw TransportError("the topology probe's verdict arrived truncated");
  }
  std::memcpy(words.data(), decision.data(), words.size() * sizeof(int32_t));
  ProbeVerdict v;
  v.kind = static_cast<ProbeVerdict::Kind>(words[0]);
  v.confirmed = words[1] != 0;
  v.rounds = words[2];
  v.group_of_node.assign(words.begin() + 3, words.end());
  std::memcpy(&v.seconds, decision.data() + words.size() * sizeof(int32_t), sizeof(double));
  v.reason.assign(decision.begin() + head, nul);
  v.checks.assign(nul + 1, decision.end());
  return v;
}

}  // namespace ddl
