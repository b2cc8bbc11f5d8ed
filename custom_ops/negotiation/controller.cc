#include "controller.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace ddl {

namespace {

// Layout of the word vector every rank contributes to the per-cycle AND:
// word 0 holds flags stored inverted (a rank clears a bit to raise it, so
// the AND computes "any rank raised it"); then one bit per cache slot
// (AND = offered by every rank); then the same bits inverted (AND of the
// inverses = no rank offered it, i.e. NOT any); then one bit per rank,
// cleared by a rank that has joined.
constexpr uint64_t kFlagHasRequests = 1u << 0;   // some rank has names to offer
constexpr uint64_t kFlagShutdown = 1u << 1;      // some rank is shutting down
constexpr uint64_t kFlagCoordinator = 1u << 2;   // rank 0 has a verdict to send

}  // namespace

Controller::Controller(ControlPlane& plane, const Config& config)
    : plane_(plane), cache_(config.cache_capacity) {
  if (plane.rank() == 0) coordinator_ = std::make_unique<Coordinator>(plane.size(), config);
}

bool Controller::Offer(const Request& request) {
  if (pending_.count(request.name)) return false;
  PendingRequest p;
  p.request = request;
  int slot = -1;
  p.cached = cache_.Find(request, &slot);
  if (!p.cached) unsent_.push_back(request);
  pending_.emplace(request.name, std::move(p));
  return true;
}

void Controller::DropAll() {
  pending_.clear();
  unsent_.clear();
}

Controller::Words::Words(int slots, int ranks)
    : slots(slots), slot_words((slots + 63) / 64), joined_at(1 + 2 * slot_words),
      bits(joined_at + (ranks + 63) / 64, ~uint64_t(0)) {
  // The "all" half starts cleared (a rank sets the slots it offers); flags,
  // the "none" half and the joined bits start set.
  for (int i = 1; i <= slot_words; ++i) bits[i] = 0;
}

void Controller::Words::SetAll(int slot) { bits[1 + slot / 64] |= uint64_t(1) << (slot % 64); }
void Controller::Words::ClearNone(int slot) {
  bits[1 + slot_words + slot / 64] &= ~(uint64_t(1) << (slot % 64));
}
bool Controller::Words::All(int slot) const { return (bits[1 + slot / 64] >> (slot % 64)) & 1; }
bool Controller::Words::None(int slot) const {
  return (bits[1 + slot_words + slot / 64] >> (slot % 64)) & 1;
}
void Controller::Words::MarkJoined(int rank) {
  bits[joined_at + rank / 64] &= ~(uint64_t(1) << (rank % 64));
}
bool Controller::Words::Joined(int rank) const {
  return !((bits[joined_at + rank / 64] >> (rank % 64)) & 1);
}

Negotiated Controller::Negotiate(bool shutting_down) {
  Words words = OwnWords(shutting_down);
  plane_.AllreduceBitwiseAnd(words.bits, pending_.empty() && !shutting_down);

  Negotiated out;
  out.exchanged = !(words.bits[0] & kFlagHasRequests) || !(words.bits[0] & kFlagCoordinator);
  out.shutdown = !(words.bits[0] & kFlagShutdown);
  ReadJoins(words, &out);
  const std::vector<int> partial = TakeCachedReady(words, &out);
  const ResponseList responses = out.exchanged ? ExchangeByName() : ResponseList();
  if (coordinator_) coordinator_->TrackPartialSlots(partial, cache_, Clock::now());
  ApplyResponses(responses, &out);
  return out;
}

Controller::Words Controller::OwnWords(bool shutting_down) {
  Words words(cache_.num_slots(), plane_.size());
  uint64_t& flags = words.bits[0];
  if (!unsent_.empty()) flags &= ~kFlagHasRequests;
  if (shutting_down) flags &= ~kFlagShutdown;
  if (coordinator_) {
    coordinator_->CheckStalls(Clock::now());
    if (coordinator_->HasPendingVerdict()) flags &= ~kFlagCoordinator;
  }
  if (joined_) {
    const int me = plane_.rank();
    words.MarkJoined(me);
    // A joined rank agrees to every cached name, without claiming to have
    // offered it (the "none" half stays set), so a name runs once every
    // active rank offers it. It cannot stand in for an alltoall or for a
    // broadcast from itself: those wait until the coordinator, seeing them
    // by name, refuses them on every rank.
    for (int slot = 0; slot < words.slots; ++slot) {
      if (!cache_.Occupied(slot)) continue;
      const Request& r = cache_.RequestAt(slot);
      if (r.collective == Collective::kAlltoall) continue;
      if (r.collective == Collective::kBroadcast && r.root == me) continue;
      words.SetAll(slot);
    }
  }
  for (const auto& [name, p] : pending_) {
    if (!p.cached) continue;
    int slot = -1;
    cache_.Find(p.request, &slot);
    words.SetAll(slot);
    words.ClearNone(slot);
  }
  return words;
}

void Controller::ReadJoins(const Words& words, Negotiated* out) {
  const int n = plane_.size();
  std::vector<bool> joined(n);
  for (int r = 0; r < n; ++r) joined[r] = words.Joined(r);
  const int num_joined = static_cast<int>(std::count(joined.begin(), joined.end(), true));
  out->active = num_joined == n ? n : n - num_joined;
  if (was_joined_.empty()) was_joined_.assign(n, false);
  if (num_joined == n) {
    out->all_joined = true;
    for (int r = 0; r < n; ++r) {
      if (!was_joined_[r]) out->last_joined = r;
    }
    // Every join ends now; a join called next starts a new round.
    was_joined_.assign(n, false);
  } else {
    was_joined_ = joined;
  }
  if (coordinator_) coordinator_->SetJoined(joined);
}

std::vector<int> Controller::TakeCachedReady(const Words& words, Negotiated* out) {
  // Cached names offered by every rank run first, in slot order; names
  // offered by some but not all go to the coordinator's stall tracking.
  std::vector<int> partial;
  for (int slot = 0; slot < words.slots; ++slot) {
    const bool all = words.All(slot);
    const bool none = words.None(slot);
    // With ranks joined, "all" can hold for a name nobody offered (every
    // rank joined agrees to everything): it runs only if some rank offered it.
    if (all && !none) {
      const std::string& name = cache_.NameAt(slot);
      out->run.push_back(name);
      if (joined_ && !pending_.count(name)) out->stand_ins.emplace(name, cache_.RequestAt(slot));
    } else if (!none) {
      partial.push_back(slot);
    }
  }
  return partial;
}

ResponseList Controller::ExchangeByName() {
  std::vector<std::vector<char>> gathered = plane_.GatherBytes(EncodeRequests(unsent_), 0);
  unsent_.clear();
  std::vector<char> encoded;
  if (coordinator_) {
    for (const auto& bytes : gathered) coordinator_->Add(DecodeRequests(bytes), cache_, Clock::now());
    encoded = EncodeResponses(coordinator_->Respond());
  }
  plane_.BroadcastBytes(encoded, 0);
  return DecodeResponses(encoded);
}

void Controller::ApplyResponses(const ResponseList& responses, Negotiated* out) {
  const size_t cache_ready = out->run.size();
  for (const std::string& name : responses.evictions) {
    cache_.Evict(name);
    auto it = pending_.find(name);
    // Cache-ready names of this cycle run anyway; others go back to naming.
    if (it != pending_.end() && it->second.cached &&
        std::find(out->run.begin(), out->run.begin() + cache_ready, name) ==
            out->run.begin() + cache_ready) {
      it->second.cached = false;
      unsent_.push_back(it->second.request);
    }
  }
  for (const auto& [name, message] : responses.errors) {
    if (pending_.erase(name)) out->refused.emplace_back(name, message);
  }
  for (const std::string& name : out->run) pending_.erase(name);
  for (size_t i = 0; i < responses.ready.size(); ++i) {
    const std::string& name = responses.ready[i];
    auto it = pending_.find(name);
    if (it == pending_.end() && joined_ && i < responses.stand_ins.size()) {
      cache_.Insert(responses.stand_ins[i]);
      out->run.push_back(name);
      out->stand_ins.emplace(name, responses.stand_ins[i]);
      continue;
    }
    if (it == pending_.end()) {
      throw std::runtime_error("coordinator cleared '" + name + "', which this rank never offered");
    }
    // Every rank inserts the same requests in the same order, so slots agree.
    cache_.Insert(it->second.request);
    out->run.push_back(name);
    pending_.erase(it);
  }
  out->fatal = responses.fatal;
}

std::string Controller::RanksShuttingDown(bool me) {
  // A cleared bit is a rank that shuts down.
  const int n = plane_.size();
  std::vector<uint64_t> bits((n + 63) / 64, ~uint64_t(0));
  const int r = plane_.rank();
  if (me) bits[r / 64] &= ~(uint64_t(1) << (r % 64));
  plane_.AllreduceBitwiseAnd(bits, false);
  std::string ranks;
  for (int i = 0; i < n; ++i) {
    if (bits[i / 64] >> (i % 64) & 1) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(i);
  }
  return "rank(s) [" + ranks + "]";
}

}  // namespace ddl
