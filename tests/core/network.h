// The links of a harness cluster (tests/core/in_process.h): each node (a
// run of world ranks) has a link to its rack's switch, each rack an uplink
// to the core; each direction of a link is its own queue. Rates are in
// bytes per second, per link (node links and uplinks), set by a check;
// unset links are instant, and a silenced node's link passes nothing.
//
// Links can also stall together (SetStalls): every link passes nothing
// for part of each period, as links do when a switch's buffers fill or
// ranks that outnumber cores leave them idle, then moves on.
//
// A message between nodes crosses every link on its path at once (cut
// through), and each link shares its rate equally among the messages on it
// (as TCP flows share a link), so many messages over a slow uplink all
// move and all finish late: the case where a transfer is slow but moving
// while nothing completes for longer than the peer timeout. A message is
// there when every link of its path has passed all of its bytes; its bytes
// moved so far are the least any of its links has passed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <vector>

namespace ddl_test {

class Network {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kInstant = std::numeric_limits<double>::infinity();
  // A message that did not cross any rated link.
  static constexpr int64_t kNoMessage = -1;

  // World rank w is on node w / ranks_per_node, in rack node / nodes_per_rack.
  void SetShape(int ranks_per_node, int nodes_per_rack) {
    std::lock_guard<std::mutex> lock(mutex_);
    ranks_per_node_ = ranks_per_node;
    nodes_per_rack_ = nodes_per_rack;
  }
  // Applies to the messages sent from now on.
  void SetRates(double node_link, double uplink) {
    std::lock_guard<std::mutex> lock(mutex_);
    node_rate_ = node_link;
    uplink_rate_ = uplink;
  }
  // From now on, every link passes nothing for `stall_s` seconds at the
  // end of each `period_s` (0 < stall_s < period_s).
  void SetStalls(double period_s, double stall_s) {
    std::lock_guard<std::mutex> lock(mutex_);
    stall_origin_ = Clock::now();
    period_s_ = period_s;
    stall_s_ = stall_s;
  }
  // Node `node`'s link passes nothing of the messages sent from now on.
  void Silence(int node) {
    std::lock_guard<std::mutex> lock(mutex_);
    silent_.insert(node);
  }

  // Starts a message of `bytes` from world rank `from` to `to`: its id, or
  // kNoMessage when it is there at once (same node, or only instant links).
  int64_t Send(int from, int to, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int a = from / ranks_per_node_, b = to / ranks_per_node_;
    if (a == b || bytes == 0) return kNoMessage;
    std::vector<std::pair<int, double>> path = {{LinkId(0, a), NodeRate(a)}};
    const int ra = a / nodes_per_rack_, rb = b / nodes_per_rack_;
    if (ra != rb) {
      path.push_back({LinkId(1, ra), uplink_rate_});
      path.push_back({LinkId(2, rb), uplink_rate_});
    }
    path.push_back({LinkId(3, b), NodeRate(b)});
    const auto now = Clock::now();
    const auto link_now = LinkTime(now);
    Message m{from, to, static_cast<double>(bytes), {}, now};
    double slowest = kInstant;
    for (const auto& [id, rate] : path) {
      if (rate == kInstant) continue;
      Link& link = links_[id];
      Advance(link, link_now);
      link.rate = rate;
      link.active[next_id_] = m.bytes;
      m.links.push_back(id);
      slowest = std::min(slowest, rate);
    }
    if (m.links.empty()) return kNoMessage;
    // No link is faster than alone: the message cannot be there sooner.
    m.earliest = slowest <= 0 ? Clock::time_point::max() : now + Seconds(m.bytes / slowest);
    messages_[next_id_] = m;
    return next_id_++;
  }

  // True once message `id` is all there (kNoMessage: always). Never
  // blocks; cheap before the earliest time the message could be there.
  bool Arrived(int64_t id) {
    if (id == kNoMessage) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = messages_.find(id);
    if (it == messages_.end()) return true;  // counted and forgotten
    const auto now = Clock::now();
    if (now < it->second.earliest) return false;
    for (int link : it->second.links) Advance(links_[link], LinkTime(now));
    return Settle(id);
  }

  // When message `id` will be there if nothing else is sent meanwhile
  // (Clock::time_point::max() for a silent link): a waiter's wake-up.
  Clock::time_point Expected(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = messages_.find(id);
    if (id == kNoMessage || it == messages_.end()) return Clock::now();
    const auto now = Clock::now();
    const auto link_now = LinkTime(now);
    Clock::time_point latest = now;
    for (int id_link : it->second.links) {
      Link& link = links_[id_link];
      Advance(link, link_now);
      auto mine = link.active.find(id);
      if (mine == link.active.end()) continue;
      if (link.rate <= 0) return Clock::time_point::max();
      // Processor sharing with no arrivals: the ones with less left finish
      // first, then the rest share the rate.
      std::vector<double> left;
      for (const auto& [other, bytes] : link.active) left.push_back(bytes);
      std::sort(left.begin(), left.end());
      double t = 0, done = 0;
      size_t n = left.size();
      for (double r : left) {
        t += (r - done) * n / link.rate;
        done = r;
        --n;
        if (r >= mine->second) break;
      }
      // In link time, which runs no faster than the clock: at worst a
      // waiter looks too early, and again.
      latest = std::max(latest, now + (link.last - link_now) + Seconds(t));
    }
    return latest;
  }

  // Bytes of world rank w's messages (sent and received) that have crossed
  // its path's links so far; any thread.
  uint64_t MovedBytes(int w) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = LinkTime(Clock::now());
    for (auto& [id, link] : links_) Advance(link, now);
    double moving = 0;
    for (const auto& [id, m] : messages_) {
      if (m.from != w && m.to != w) continue;
      double passed = m.bytes;
      for (int link : m.links) {
        auto it = links_[link].active.find(id);
        if (it != links_[link].active.end()) passed = std::min(passed, m.bytes - it->second);
      }
      moving += passed;
    }
    return done_[w] + static_cast<uint64_t>(moving);
  }

 private:
  struct Link {
    double rate = kInstant;
    Clock::time_point last{};  // in link time (LinkTime)
    std::map<int64_t, double> active;  // message -> bytes still to pass
  };
  struct Message {
    int from, to;
    double bytes;
    std::vector<int> links;
    Clock::time_point earliest;
  };

  static Clock::duration Seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  int LinkId(int kind, int index) const { return index * 4 + kind; }
  // The links' own clock: the time less every stall so far, so links
  // advanced to it pass nothing during a stall.
  Clock::time_point LinkTime(Clock::time_point now) const {
    if (period_s_ <= 0 || now <= stall_origin_) return now;
    const double since = std::chrono::duration<double>(now - stall_origin_).count();
    const double periods = std::floor(since / period_s_);
    const double into = since - periods * period_s_;
    const double stalled = periods * stall_s_ + std::max(0.0, into - (period_s_ - stall_s_));
    return now - Seconds(stalled);
  }
  double NodeRate(int node) const { return silent_.count(node) ? 0 : node_rate_; }

  // Moves the link's clock to `now`, sharing its rate among its messages;
  // messages it has passed whole leave it (at the moment they did).
  void Advance(Link& link, Clock::time_point now) {
    if (link.rate <= 0 || link.active.empty()) {
      link.last = std::max(link.last, now);
      return;
    }
    while (!link.active.empty() && link.last < now) {
      const double share = link.rate / link.active.size();
      double least = std::numeric_limits<double>::infinity();
      for (const auto& [id, bytes] : link.active) least = std::min(least, bytes);
      const double span = std::chrono::duration<double>(now - link.last).count();
      const double step = std::min(span, least / share);
      for (auto& [id, bytes] : link.active) bytes -= share * step;
      link.last += Seconds(step);
      if (step >= span) link.last = now;
      for (auto it = link.active.begin(); it != link.active.end();) {
        it = it->second <= 1e-6 ? link.active.erase(it) : std::next(it);
      }
    }
  }

  // Whether message `id` has left every link of its path; if so its bytes
  // count as moved and it is forgotten.
  bool Settle(int64_t id) {
    Message& m = messages_[id];
    for (int link : m.links) {
      if (links_[link].active.count(id)) return false;
    }
    done_[m.from] += static_cast<uint64_t>(m.bytes);
    done_[m.to] += static_cast<uint64_t>(m.bytes);
    messages_.erase(id);
    return true;
  }

  std::mutex mutex_;
  int ranks_per_node_ = 1, nodes_per_rack_ = std::numeric_limits<int>::max();
  double node_rate_ = kInstant, uplink_rate_ = kInstant;
  std::set<int> silent_;
  Clock::time_point stall_origin_{};
  double period_s_ = 0, stall_s_ = 0;
  std::map<int, Link> links_;
  std::map<int64_t, Message> messages_;
  std::map<int, uint64_t> done_;
  int64_t next_id_ = 0;
};

}  // namespace ddl_test
