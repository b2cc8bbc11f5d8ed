#include "coordinator.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace ddl {

namespace {
double Seconds(Coordinator::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

void Coordinator::Add(const std::vector<Request>& requests, const ResponseCache& cache,
                      Clock::time_point now) {
  for (const Request& request : requests) {
    if (cache.Contains(request.name)) evictions_.push_back(request.name);
    Offers& offers = table_[request.name];
    if (offers.by_rank.empty()) {
      offers.by_rank.resize(size_);
      offers.first_seen = now;
    }
    Request& slot = offers.by_rank[request.rank];
    if (!slot.name.empty()) continue;  // resent after an eviction: already counted
    slot = request;
    ++offers.count;
    MarkIfComplete(request.name, offers);
  }
}

bool Coordinator::Complete(const Offers& offers) const {
  if (offers.count == size_) return true;
  if (num_joined_ == 0) return false;
  for (int r = 0; r < size_; ++r) {
    if (offers.by_rank[r].name.empty() && !joined_[r]) return false;
  }
  return true;
}

void Coordinator::MarkIfComplete(const std::string& name, Offers& offers) {
  if (offers.complete || !Complete(offers)) return;
  offers.complete = true;
  completed_.push_back(name);
}

void Coordinator::SetJoined(const std::vector<bool>& joined) {
  if (joined == joined_) return;
  joined_ = joined;
  num_joined_ = static_cast<int>(std::count(joined_.begin(), joined_.end(), true));
  // A rank that just joined may complete names the others are waiting on.
  // The table is ordered by name, so every run picks them up in one order.
  for (auto& [name, offers] : table_) MarkIfComplete(name, offers);
}

void Coordinator::TrackPartialSlots(const std::vector<int>& partial_slots,
                                    const ResponseCache& cache, Clock::time_point now) {
  std::unordered_map<int, Clock::time_point> still_partial;
  // A cached tensor normally completes within a cycle or two; one that some
  // rank has not offered for a good fraction of the warning time is probably
  // stalled, and only its name (not a slot bit) lets us report who is missing.
  const double patience = std::min(1.0, config_.stall_warning_s / 2);
  for (int slot : partial_slots) {
    auto it = partial_since_.find(slot);
    Clock::time_point since = it == partial_since_.end() ? now : it->second;
    if (Seconds(now - since) >= patience && cache.Occupied(slot)) {
      evictions_.push_back(cache.NameAt(slot));
    } else {
      still_partial[slot] = since;
    }
  }
  partial_since_ = std::move(still_partial);
}

std::string Coordinator::Missing(const Offers& offers) const {
  std::ostringstream out;
  bool first = true;
  for (int r = 0; r < size_; ++r) {
    if (!offers.by_rank[r].name.empty() || joined_[r]) continue;
    out << (first ? "" : ", ") << r;
    first = false;
  }
  return out.str();
}

void Coordinator::CheckStalls(Clock::time_point now) {
  // Scanning the table every cycle would cost O(pending) per millisecond;
  // a tenth of a second is fine-grained enough for second-scale limits.
  if (now - last_stall_check_ < std::chrono::milliseconds(100)) return;
  last_stall_check_ = now;
  std::ostringstream warning, fatal;
  int stalled = 0, timed_out = 0;
  for (auto& [name, offers] : table_) {
    if (offers.complete) continue;
    double waited = Seconds(now - offers.first_seen);
    if (waited >= config_.stall_warning_s && !offers.warned) {
      offers.warned = true;
      warning << "\n  '" << name << "' waiting " << static_cast<int>(waited)
              << " s for ranks [" << Missing(offers) << "]";
      ++stalled;
    }
    if (config_.stall_timeout_s > 0 && waited >= config_.stall_timeout_s) {
      fatal << (timed_out ? "; " : "") << "'" << name << "' missing on ranks ["
            << Missing(offers) << "]";
      ++timed_out;
    }
  }
  if (stalled) {
    std::fprintf(stderr,
                 "[keras_ddl] stall warning (rank 0): %d collective(s) submitted by some ranks "
                 "but not others:%s\n"
                 "  All ranks must issue the same named collectives; a rank may be slower, "
                 "stuck, or skipping a step.\n",
                 stalled, warning.str().c_str());
    std::fflush(stderr);
  }
  if (timed_out) {
    timed_out_ = true;
    fatal_ = "stall timeout (DDL_STALL_TIMEOUT_S=" + std::to_string(config_.stall_timeout_s) +
             "): " + fatal.str();
  }
}

std::string Coordinator::Refusal(const Request& r) const {
  // Checked here, not by the caller, so every rank gets the error in the
  // same cycle and none is left waiting for a collective another refused.
  const bool reduces =
      r.collective == Collective::kAllreduce || r.collective == Collective::kReducescatter;
  if (reduces && r.op == ReduceOp::kAverage && r.dtype == DataType::kBool) {
    return "op=Average is not defined for dtype bool; use op=Sum (logical or) or op=Min "
           "(logical and), or cast to a float dtype";
  }
  if (reduces && r.op == ReduceOp::kAverage && !IsFloating(r.dtype)) {
    return std::string("op=Average is not defined for integer dtype ") + DataTypeName(r.dtype) +
           " (it would silently floor); use op=Sum and divide, or a float dtype";
  }
  if ((r.collective == Collective::kReducescatter || r.collective == Collective::kAlltoall) &&
      r.shape.empty()) {
    return std::string(CollectiveName(r.collective)) +
           " needs a tensor of rank >= 1, got a scalar";
  }
  if (r.collective == Collective::kBroadcast && (r.root < 0 || r.root >= size_)) {
    return "root_rank=" + std::to_string(r.root) + " is outside [0, " + std::to_string(size_) + ")";
  }
  if (num_joined_ > 0) {
    std::string joined;
    for (int i = 0; i < size_; ++i) {
      if (joined_[i]) joined += (joined.empty() ? "" : ", ") + std::to_string(i);
    }
    if (r.collective == Collective::kBroadcast && joined_[r.root]) {
      return "root_rank=" + std::to_string(r.root) +
             " has joined (ddl.join) and has no tensor to send";
    }
    if (r.collective == Collective::kAlltoall) {
      return "alltoall cannot run while rank(s) [" + joined +
             "] have joined (ddl.join): a joined rank has no rows to send or receive";
    }
  }
  return "";
}

std::string Coordinator::AllgatherTooLarge(const Offers& offers) const {
  // Each rank's bytes in 128 bits: shapes come from the ranks and are
  // trusted to be non-negative, not to be small.
  unsigned __int128 total = 0;
  std::string each;
  for (int r = 0; r < size_; ++r) {
    const Request& q = offers.by_rank[r];
    if (q.name.empty()) continue;  // joined: no rows
    unsigned __int128 bytes = DataTypeSize(q.dtype);
    for (int64_t d : q.shape) bytes *= static_cast<unsigned __int128>(d < 0 ? 0 : d);
    // A product past 2^64 is far past the limit whatever the rest adds.
    const bool huge = bytes >> 64 != 0;
    total += huge ? (static_cast<unsigned __int128>(1) << 64) : bytes;
    each += (each.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + ": " +
            (huge ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(bytes)));
  }
  if (total <= static_cast<unsigned __int128>(kMaxAllgatherBytes)) return "";
  const std::string sum = total >> 64 != 0 ? std::string("more than 2^64")
                                           : std::to_string(static_cast<uint64_t>(total));
  return "the output would hold " + sum + " bytes (" + each + "), more than the " +
         std::to_string(kMaxAllgatherBytes) +
         " bytes (2^31 - 1) one allgather can place (MPI counts are ints); gather the tensor "
         "in parts";
}

ResponseList Coordinator::Respond() {
  ResponseList out;
  out.evictions = std::move(evictions_);
  evictions_.clear();
  for (const std::string& name : completed_) {
    Offers& offers = table_[name];
    // Joined ranks offered nothing: compare the offers that exist.
    int first_rank = 0;
    while (offers.by_rank[first_rank].name.empty()) ++first_rank;
    const Request& first = offers.by_rank[first_rank];
    std::string mismatch;
    // A rank's own invalid arguments come first: they are the cause even
    // when they also make its request differ from the others'.
    // Ranks with the same reason are named together, in rank order.
    std::vector<std::pair<std::string, std::string>> reasons;  // reason, ranks
    for (int r = 0; r < size_; ++r) {
      const std::string& why = offers.by_rank[r].invalid;
      if (why.empty()) continue;
      auto it = std::find_if(reasons.begin(), reasons.end(),
                             [&](const auto& e) { return e.first == why; });
      if (it == reasons.end()) it = reasons.insert(reasons.end(), {why, ""});
      it->second += (it->second.empty() ? "" : ", ") + std::to_string(r);
    }
    for (const auto& [why, ranks] : reasons) {
      const bool several = ranks.find(',') != std::string::npos;
      mismatch += (mismatch.empty() ? "" : "; ") + why +
                  (several ? " on ranks [" + ranks + "]" : " on rank " + ranks);
    }
    const bool invalid = !mismatch.empty();
    for (int r = first_rank + 1; r < size_ && mismatch.empty(); ++r) {
      if (offers.by_rank[r].name.empty()) continue;
      if (!first.Compatible(offers.by_rank[r])) mismatch = first.Difference(offers.by_rank[r]);
    }
    std::string refusal = mismatch.empty() ? Refusal(first) : "";
    if (mismatch.empty() && refusal.empty() && first.collective == Collective::kAllgather) {
      refusal = AllgatherTooLarge(offers);
    }
    if (invalid) {
      out.errors.emplace_back(name, std::string(CollectiveName(first.collective)) +
                                        " of tensor '" + name + "': " + mismatch);
    } else if (!mismatch.empty()) {
      out.errors.emplace_back(name, kMismatchPrefix + std::string(CollectiveName(first.collective)) +
                                        " for tensor '" + name + "': " + mismatch);
    } else if (!refusal.empty()) {
      out.errors.emplace_back(name, std::string(CollectiveName(first.collective)) +
                                        " of tensor '" + name + "': " + refusal);
    } else {
      out.ready.push_back(name);
      if (num_joined_ > 0) out.stand_ins.push_back(first);
    }
    table_.erase(name);
  }
  completed_.clear();
  if (timed_out_) out.fatal = fatal_;
  timed_out_ = false;
  return out;
}

}  // namespace ddl
