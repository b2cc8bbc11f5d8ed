// DDL_TOPOLOGY=probe: the racks measured at start-up instead of told
// (docs/untold_network.md, "Finding the racks by measuring").
//
// One rank per node (each node's local rank 0) takes part. Rank 0 of them
// runs the judge (JudgeProbe) and tells the others which rounds to run;
// in a round every node sends a few hundred KiB (see kProbeBytes) to at
// most one node and receives from at most one, all nodes at once, and the
// receiver times its message from the round's start. Flows that share an
// uplink slow each other down, flows inside a switch do not. A pair's
// rate is its slower direction.
//
// 1. The first pass: in round d, d = 1 ... K-1, every node sends to the
//    node d places after it (mod K), so every ordered pair is measured
//    once while K - 1 other flows run. Its rates are classified
//    (ClassifyProbeRates):
//    - racks: the pairs at least half as fast as the fastest tenth link
//      the nodes into groups of two or more, and every pair across groups
//      is at most 2/3 as fast as the median pair within a group;
//    - one switch: every pair reached half the fastest tenth's rate and
//      2/3 of the median pair's (kProbeOneSwitchShare says why);
//    - unclear: anything else.
// 2. Unclear, and the first pass took under kProbePassSeconds: the rounds
//    that held a direction below the one-switch bar run again, whole (all
//    their flows at once, so a shared uplink is shared as before), and
//    each such direction keeps the faster of its two measurements. A rank
//    that lost its core only slows a flow; an oversubscribed uplink stays
//    slow. The rates are classified again.
// 3. Racks: acted on only when a second, independent pass finds the same
//    partition (ConfirmationRounds: every pair within a group, and one
//    pairing across each two groups, classified alike). A second pass that
//    finds other racks gets one more pass to confirm those (the first was
//    wrong, the second pass measured every pair it needs); any other
//    disagreement makes the verdict unclear.
// Unclear runs the chain, as with nothing told. Rank 0 prints what it
// measured in the autotuner's table style and every rank gets its
// verdict, so all agree.
//
// It errs when a rack's uplink carries one flow as fast as a node link
// (rounds with many flows across then show the slowdown, but the pairs
// measured in rounds with one flow across look as fast as those inside a
// rack, so the groups merge: unclear or one switch), when the node links
// themselves are the limit unevenly (ranks sharing cores, other jobs'
// traffic: unclear), and, like any measurement, when other traffic
// shares the uplinks while it runs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../transport/group.h"
#include "topology.h"

namespace ddl {

// Bytes every node sends in each round: kProbeBytes, doubled (up to
// kProbeMaxBytes) until the slowest receive of a round at distance K/2
// takes kProbeRoundSeconds, so a round times the links rather than the
// fixed costs of its messages and the receivers' start skew on fast
// links, and stays short behind slow uplinks (RoundBytes says why K/2).
constexpr size_t kProbeBytes = 256 << 10;
constexpr size_t kProbeMaxBytes = 64 << 20;
constexpr double kProbeRoundSeconds = 0.02;
// Pieces of every round's message: the receiver times the pieces after
// the first, which tells a sender that started late from a slow link
// (Round in topology_probe.cc).
constexpr size_t kProbePieces = 8;
// The shortest time a receive is taken to last, a tenth of the sized
// round: a rate faster than bytes / kProbeShortestSeconds is read as that
// rate. A message inside a token bucket's burst (the test cluster's links
// hold 256 KB), or one that arrived before its receiver left the round's
// start, arrives in microseconds: read as it is, the pairs inside a rack
// behind slow uplinks (2 x 8 nodes at 400 Mbit/s behind 100 Mbit/s:
// 256 KiB messages on 50 MB/s links) measured from 80 to 3900 MB/s, and
// half the fastest tenth, the bar that links a pair into a group, left
// true pairs of a rack below it. A flow that a link or an uplink limits
// in a sized round takes longer than this, so it is read as it was.
constexpr double kProbeShortestSeconds = kProbeRoundSeconds / 10;
// The re-measure of slow directions (step 2) runs only when the first
// pass took less than this: behind slow uplinks a pass takes seconds, and
// its verdict there is racks (confirmed cheaply) or unclear anyway.
constexpr double kProbePassSeconds = 1.0;
// Confirmation passes at most (step 3): the second confirms the first
// pass's racks; a third may confirm the racks the second found instead.
constexpr int kProbeConfirmations = 2;
// Pairs at least this share of the fastest tenth's rate are linked into
// one group (a rack) by ClassifyProbeRates.
constexpr double kProbeLinkShare = 0.5;
// "One switch" needs every pair at kProbeLinkShare of the fastest tenth
// and at this share of the median pair's rate. The verdict runs the
// pairwise schedule, whose reduce-scatter sends N/2 x S across each uplink
// of 2 racks of N nodes, so it must not be given behind an oversubscribed
// uplink. In the round at distance N all N flows of a rack cross its
// uplink of rate U: those pairs get U/N. Fewer than half the pairs are
// inside a rack, and the pairs across that reach the median are those at
// distance about sqrt(N/2), which get a node link's rate L unless the
// uplink is far slower still. Every pair at 2/3 of the median then means
// U >= 2/3 x N x L, where the reduce-scatter's N/2 x S across the uplink
// takes at most 3/4 x S / L, under the (K-1)/K x S / L its node links
// take for K >= 4 nodes: the pairwise schedule stays bound by the node
// links even if the racks are real. At 1/2 of the fastest tenth alone (the
// rule before), an uplink at 2:1 oversubscription passed as one switch
// (its farthest pairs measure exactly half) with the uplink setting the
// pace. The median, not the fastest tenth, is the reference because ranks
// that share cores inflate a few pairs' rates (a receiver that leaves the
// round's start late finds bytes already arrived), never the median.
constexpr double kProbeOneSwitchShare = 2.0 / 3.0;

struct ProbeVerdict {
  enum Kind { kRacks, kOneSwitch, kUnclear };
  Kind kind = kUnclear;
  // Per node (in the probe's order), its group: 0, 1, ... numbered by
  // the group's lowest node. Groups are racks only with kRacks.
  std::vector<int> group_of_node;
  std::string reason;  // one line: why this verdict
  // What was measured after the first pass and what it showed: the slow
  // directions measured again, and for racks whether a second pass
  // confirmed them ("confirmed: ..." or "unconfirmed: ..."); empty when
  // the first pass's verdict stood alone (one switch at once).
  std::string checks;
  bool confirmed = false;  // racks that a second, independent pass found too
  int rounds = 0;          // rounds run in all passes
  double seconds = 0;      // what the probe took, rank 0's clock
};

// A round of the probe: send_to[n] is the node node n sends to, -1 for
// none; no two nodes send to the same node.
using ProbeRound = std::vector<int>;
// rate[from][to] in bytes per second; -1 for a pair the rounds did not
// measure (ClassifyProbeRates leaves such pairs out).
using ProbeRates = std::vector<std::vector<double>>;
// Runs the rounds, one after the other, on the nodes and returns what
// they measured (a direction measured twice keeps its faster).
using MeasureRounds = std::function<ProbeRates(const std::vector<ProbeRound>&)>;

// The first pass's rounds at the given distances: node n sends to node
// n + d (mod k).
std::vector<ProbeRound> RingRounds(int k, const std::vector<int>& distances);

// The confirmation pass of a partition: inside every group of two or more,
// rounds d = 1 ... size-1 (each member to the member d places on, all
// groups at once), so every pair within a group is measured both ways
// without crossing an uplink the groups are right about; then for each two
// groups one round pairing their members in order (both directions at
// once), so every flow of it crosses the boundary between them. If a true
// rack was split, that pairing is fast; if a group mixes racks, a pair
// within it is slow: either way the same classification finds another
// partition.
std::vector<ProbeRound> ConfirmationRounds(const std::vector<int>& group_of_node);

// Steps 1-3 above on k nodes, measuring through `measure`;
// `seconds_so_far` is the probe's clock (step 2 runs only under
// kProbePassSeconds). Deterministic given what `measure` returns. Fills
// `first_rates` (when not null) with the first pass's rates, slow
// directions re-measured, for the table.
ProbeVerdict JudgeProbe(int k, const MeasureRounds& measure,
                        const std::function<double()>& seconds_so_far,
                        ProbeRates* first_rates = nullptr);


// The seconds a receive of `bytes` in `pieces` pieces is timed at: the
// first piece (`first_bytes`) arrived `first` seconds after the round's
// start, the last `seconds` after it. The pieces after the first give the
// flow's rate, and the sender's start is estimated as the first piece's
// arrival less one piece at that rate; the time is counted from there,
// at most halved, and is at least kProbeShortestSeconds.
double ProbeFlowSeconds(size_t bytes, size_t first_bytes, size_t pieces, double first,
                        double seconds);

// The bytes of a round of the plan, given the sized bytes: at least
// 2 x kProbeBytes in the rounds at distance 1 and K-1 of the first pass.
// With racks listed rack by rack, those are the rounds whose uplinks
// carry one flow each, and a message inside an uplink's token-bucket
// burst (the test cluster's hold 256 KB) crosses it at once: both
// directions of the pair across then read as fast as the pairs within,
// and the racks merge. Twice the burst leaves half the message at the
// uplink's rate. Sized rounds of more bytes (one switch) are unchanged.
size_t ProbeRoundBytes(const ProbeRound& round, size_t bytes);

// The decision from measured rates, rate[from][to] in bytes per second
// (the diagonal unused; pairs with a negative rate either way left out).
// Deterministic: every caller with the same rates gets the same verdict.
ProbeVerdict ClassifyProbeRates(const std::vector<std::vector<double>>& rate);

// "racks", "one switch" or "unclear".
const char* VerdictName(ProbeVerdict::Kind kind);

// The table rank 0 prints (headed "keras_ddl topology probe:").
std::string DescribeProbe(const std::vector<std::vector<double>>& rate,
                          const ProbeVerdict& verdict, const std::vector<int>& first_rank_of_node,
                          size_t bytes, double seconds);

// Collective over `world`. `leaders`: the group of the nodes' local ranks
// 0, one per node in node order, on those ranks; null on the others.
// `first_rank_of_node[n]`: node n's lowest rank in `world` (for the
// table). Rank 0 of `world` must be node 0's leader. Every rank returns the
// same verdict; rank 0 prints the table to stderr when `print`. Every wait
// is a Group wait, so a dead or cut-off rank ends it at the peer timeout.
ProbeVerdict ProbeRacks(Group& world, Group* leaders, const std::vector<int>& first_rank_of_node,
                        bool print = true);

// The agreed topology of a job with DDL_TOPOLOGY=probe, or with none given
// (one switch, source "probe" or ""), made the verdict's, with source
// "probe": racks "probe1", "probe2", ... (numbered, like every rack, by
// their lowest rank), one switch, or one switch marked `uncertain`.
void ApplyProbeVerdict(const ProbeVerdict& verdict, Topology* topology);

}  // namespace ddl
