// The collective part of add_process_set, run by a caller's thread over the
// job's setup group (every rank). A rank that never calls, a rank that
// passes another list, or a set that fails to build on some node is an
// error on every rank within the peer timeout, never a hang: before the
// blocking split, and again after building, the ranks agree through rank
// 0, which waits for each rank's word with a deadline and sends every rank
// its verdict.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../common/types.h"
#include "../transport/group.h"

namespace ddl {

struct Verdict {
  std::string text;  // "" when the ranks agree
  // False when some rank's offer or rank 0's verdict did not arrive in
  // time: a message of this round may still come, so the group is out of
  // step and must not run another round.
  bool in_step = true;
};

// Rank 0's decision from every rank's offer (indexed by rank; nullopt: it
// did not arrive within the timeout): "" to go ahead, else the error.
using Decide = std::function<std::string(const std::vector<std::optional<std::string>>&)>;

// One round over `group`: every rank sends rank 0 `offer`; rank 0 waits up
// to `timeout_s` (0: no limit) for every other rank's, decides, and sends
// each rank the verdict (also a rank whose offer never came: a late caller
// reads it as its answer). The others wait for the verdict up to twice the
// timeout, since rank 0 may call up to one timeout after them. Waits probe
// and sleep: no receive is posted for a message that may never come.
Verdict AgreeThroughRankZero(Group& group, const std::string& offer, double timeout_s,
                             const Decide& decide);

// add_process_set(ranks) on this rank: agree on the list (`problem`: what
// this rank found wrong with it, or ""), split `setup`, let `build` set up
// the set on its members (given the set's group; non-members are not
// called), then agree that every member built it. The same error on every
// rank otherwise, naming the ranks concerned. `*out_of_step` is set when a
// rank did not answer in time (see Verdict). TransportErrors are thrown.
Status SetUpProcessSet(Group& setup, const std::vector<int>& ranks, const std::string& problem,
                       double timeout_s,
                       const std::function<Status(std::unique_ptr<Group>)>& build,
                       bool* out_of_step);

}  // namespace ddl
