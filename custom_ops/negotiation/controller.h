// Negotiation: which named collectives every rank is ready to run, and in
// which order. Each cycle every rank offers what became ready here: names
// the response cache holds cost one bit in a bitwise AND over all ranks,
// others go by name to the coordinator (rank 0), which answers every rank
// with the same list. The controller knows requests, never data buffers:
// the engine keeps the work and runs what Negotiate returns.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../transport/control_plane.h"
#include "../common/config.h"
#include "coordinator.h"
#include "message.h"
#include "response_cache.h"

namespace ddl {

// What one negotiation cycle decided; identical on every rank except
// `refused`, which lists only the names pending on this rank.
struct Negotiated {
  // Ready on every rank, in the order every rank must execute them.
  std::vector<std::string> run;
  // Names that cannot run, with the message to raise (without the rank).
  std::vector<std::pair<std::string, std::string>> refused;
  // Non-empty: the job cannot continue (a stall timed out); all ranks stop.
  std::string fatal;
  // Some rank asked to shut down: every rank stops after this cycle.
  bool shutdown = false;
  // Names of `run` this rank never offered because it has joined: it takes
  // part with a stand-in built from another rank's request.
  std::unordered_map<std::string, Request> stand_ins;
  // Ranks that have not joined (their data counts in an Average); the
  // plane's size while no rank has joined.
  int active = 0;
  // Every rank has joined: each one's join ends this cycle, returning
  // `last_joined` (the highest rank among those that joined last).
  bool all_joined = false;
  int last_joined = -1;
  // The by-name exchange ran (the cycle was not only the AND).
  bool exchanged = false;
};

class Controller {
 public:
  // `plane` spans every rank of the job; rank 0 coordinates.
  Controller(ControlPlane& plane, const Config& config);

  // Adds a request this rank is ready to run. False if a request of that
  // name is already pending here (names must be unique while in flight).
  bool Offer(const Request& request);
  bool HasPending() const { return !pending_.empty(); }

  // While joined, this rank tells the others so in every cycle, and stands
  // in (zeros in, result discarded) for every collective they run.
  void SetJoined(bool joined) { joined_ = joined; }

  // One cycle; collective over the plane. `shutting_down`: this rank asks
  // every rank to stop. Throws PeerTimeout when a rank stays silent.
  Negotiated Negotiate(bool shutting_down);

  // Forgets every pending request (the engine failed their work).
  void DropAll();

  // After a cycle whose outcome was shutdown, every rank calls this once:
  // "rank(s) [..]" of those that asked (`me`: this rank did).
  std::string RanksShuttingDown(bool me);

 private:
  using Clock = std::chrono::steady_clock;
  // The word vector every rank contributes to a cycle's AND; layout in
  // controller.cc.
  struct Words {
    Words(int slots, int ranks);
    void SetAll(int slot);     // this rank offers (or, joined, accepts) the slot
    void ClearNone(int slot);  // this rank offers the slot
    void MarkJoined(int rank);
    bool All(int slot) const;   // after the AND: every rank set it
    bool None(int slot) const;  // after the AND: no rank offered it
    bool Joined(int rank) const;
    int slots, slot_words, joined_at;
    std::vector<uint64_t> bits;
  };
  // The steps of a cycle, in order.
  Words OwnWords(bool shutting_down);
  void ReadJoins(const Words& words, Negotiated* out);
  // Runs the cached names every rank offered; returns the slots only some
  // offered.
  std::vector<int> TakeCachedReady(const Words& words, Negotiated* out);
  // The by-name round: requests to rank 0, its responses to all.
  ResponseList ExchangeByName();
  void ApplyResponses(const ResponseList& responses, Negotiated* out);

  struct PendingRequest {
    Request request;
    bool cached = false;  // offered through the cache bit, not by name
  };

  ControlPlane& plane_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unordered_map<std::string, PendingRequest> pending_;
  std::vector<Request> unsent_;  // to offer by name in the next cycle
  bool joined_ = false;
  std::vector<bool> was_joined_;  // by rank, as of the previous cycle
};

}  // namespace ddl
