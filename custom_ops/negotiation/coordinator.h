// Rank 0's bookkeeping for the negotiation: which ranks have offered which
// names, whether their offers agree, and which names are stalled.
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/config.h"
#include "message.h"
#include "response_cache.h"

namespace ddl {

// How a refusal of ranks that disagree about one collective begins; the
// engine reports those as a failed precondition (Horovod's class for the
// case), and the other refusals as invalid arguments.
constexpr char kMismatchPrefix[] = "Mismatched ";
inline bool IsMismatch(const std::string& refusal) {
  return refusal.rfind(kMismatchPrefix, 0) == 0;
}

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  Coordinator(int world_size, const Config& config)
      : size_(world_size), config_(config), joined_(world_size, false) {}

  // Records the requests one rank sent this cycle. A request for a name the
  // cache holds means that rank's metadata changed: the name is evicted
  // everywhere so the other ranks resend theirs for a full comparison.
  void Add(const std::vector<Request>& requests, const ResponseCache& cache, Clock::time_point now);

  // Cached names that some but not all ranks offered this cycle: if one stays
  // like that it is evicted so the ranks that hold it say so by name, and the
  // stall report can name who is missing.
  void TrackPartialSlots(const std::vector<int>& partial_slots, const ResponseCache& cache,
                         Clock::time_point now);

  // The ranks that have joined (ddl.join), as every rank learned them this
  // cycle. A joined rank counts as having offered every name: it stands in
  // with zeros, so names the active ranks all offered become complete.
  void SetJoined(const std::vector<bool>& joined);

  // Called every cycle: warns on stderr about names some ranks have offered
  // and others not for DDL_STALL_WARNING_S, and past DDL_STALL_TIMEOUT_S
  // prepares a fatal verdict naming them and the missing ranks.
  void CheckStalls(Clock::time_point now);

  // True when the next cycle must run the full exchange even if no rank
  // has new requests (evictions or a stall verdict are waiting to be sent).
  bool HasPendingVerdict() const {
    return !evictions_.empty() || timed_out_ || !completed_.empty();
  }

  // Names complete on every rank (in completion order), mismatches,
  // evictions, and the stall verdict if there is one.
  ResponseList Respond();
  // Why a request agreed by every rank cannot run ("" if it can).
  std::string Refusal(const Request& r) const;

  // The most bytes one allgather's output may hold: MPI counts and
  // displacements are ints, so a larger output cannot be placed.
  static constexpr int64_t kMaxAllgatherBytes = 2147483647;  // 2^31 - 1

 private:
  struct Offers {
    std::vector<Request> by_rank;  // indexed by rank; name empty = not offered yet
    int count = 0;
    Clock::time_point first_seen;
    bool warned = false;
    bool complete = false;  // queued in completed_
  };
  // Every rank has offered the name or joined.
  bool Complete(const Offers& offers) const;
  // Queues the name for Respond once it is complete.
  void MarkIfComplete(const std::string& name, Offers& offers);
  Clock::time_point last_stall_check_;
  std::string Missing(const Offers& offers) const;
  // An allgather whose output (every rank's rows together) would exceed
  // kMaxAllgatherBytes: the refusal, naming each rank's bytes; else "".
  std::string AllgatherTooLarge(const Offers& offers) const;

  int size_;
  Config config_;
  std::map<std::string, Offers> table_;
  std::vector<std::string> completed_;  // names whose offers are all in, in order
  std::vector<std::string> evictions_;
  std::unordered_map<int, Clock::time_point> partial_since_;
  bool timed_out_ = false;
  std::string fatal_;
  std::vector<bool> joined_;  // by rank; all false while no rank has joined
  int num_joined_ = 0;
};

}  // namespace ddl
