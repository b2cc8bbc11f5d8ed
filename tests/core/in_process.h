// Threads as ranks: a Group (Transport and ControlPlane) over the memory of
// one process, so the core's algorithms, negotiation, node setup and the
// whole engine run without MPI or TensorFlow. Messages between a pair of
// ranks with one tag match in posting order, as MPI's do. Every wait has
// the peer clock of transport/wait.h (SetPeerTimeout, and the judge of
// SetLiveness), or without a timeout gives up after a few seconds with
// TransportError, so a deadlock in the code under test fails the check
// instead of hanging it.
//
// A Network (network.h) gives messages a time to arrive: node links and
// rack uplinks at rates a check sets (unset: instant), shared by the
// messages on them, or silenced. So a transfer that is slow but moving
// (its bytes count up in MovedBytes while nothing completes) and one that
// is silent can both be staged, at any number of ranks. The group
// operations (ControlPlane, Broadcast, AllgatherV) stay instant.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <limits>
#include <memory>

#include "network.h"
#include "transport/group.h"
#include "transport/wait.h"

namespace ddl_test {

using ddl::TransportError;
using Clock = Network::Clock;

// State shared by the ranks of one group.
class InProcessGroup {
 public:
  InProcessGroup(int size, size_t max_message_bytes,
                 std::shared_ptr<Network> network = std::make_shared<Network>())
      : size_(size), max_message_bytes_(max_message_bytes), contributions_(size),
        inbox_(size), network_(std::move(network)) {
    for (int r = 0; r < size; ++r) world_ranks_.push_back(r);
  }
  // The links of this group, its children's too.
  Network& network() { return *network_; }
  // The job-wide ranks of this group's ranks (0..size-1 unless set).
  void SetWorldRanks(std::vector<int> world_ranks) { world_ranks_ = std::move(world_ranks); }
  int size() const { return size_; }
  size_t max_message_bytes() const { return max_message_bytes_; }
  int WorldRank(int r) const { return world_ranks_.at(r); }
  // Lets a receive take a shorter message, as MPI does (the engine's
  // failure diagnosis receives a verdict of unknown length).
  void AllowShortReceives() { allow_short_receives_ = true; }

  // The group made by split number `seq` of this group for `color`; the
  // first member to ask creates it, the others get the same one.
  std::shared_ptr<InProcessGroup> Child(int64_t seq, int color, std::vector<int> world_ranks) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& child = children_[{seq, color}];
    if (!child) {
      child = std::make_shared<InProcessGroup>(static_cast<int>(world_ranks.size()),
                                               max_message_bytes_, network_);
      child->world_ranks_ = std::move(world_ranks);
    }
    return child;
  }

  // Key of the stream of messages from `src` to `dst` with `tag`.
  using Stream = std::tuple<int, int, int>;

  // Sequence number of the next message sent / receive posted on a stream.
  int64_t NextSend(const Stream& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    return sends_[s]++;
  }
  int64_t NextReceive(const Stream& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    return receives_[s]++;
  }
  void Deliver(const Stream& s, int64_t seq, const void* data, size_t bytes) {
    const int64_t id = network_->Send(WorldRank(std::get<0>(s)), WorldRank(std::get<1>(s)), bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const char* p = static_cast<const char*>(data);
      Mail& m = mail_[{s, seq}];
      m.bytes.assign(p, p + bytes);
      m.message = id;
    }
    // Only the receiver wakes (hundreds of thread-ranks waking for every
    // message would keep the cores from the ranks that have work).
    inbox_[std::get<1>(s)].notify_all();
  }
  // Waits for the message (with `clock`'s timeout and judge, if it has a
  // timeout; else kPatience, then a deadlock error).
  void Collect(const Stream& s, int64_t seq, void* data, size_t bytes, ddl::PeerClock& clock) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto key = std::make_pair(s, seq);
    const std::string what = "a receive from rank " + std::to_string(WorldRank(std::get<0>(s))) +
                             " with tag " + std::to_string(std::get<2>(s));
    const auto patience_ends = Clock::now() + kPatience;
    clock.BeginWait();
    for (;;) {
      auto it = mail_.find(key);
      const auto now = Clock::now();
      if (it != mail_.end() && network_->Arrived(it->second.message)) break;
      const bool timed = clock.timeout_s() > 0;
      if (timed && clock.Expired(now)) {
        lock.unlock();
        const std::string why = clock.Judge(what, {WorldRank(std::get<0>(s))});
        if (!why.empty()) clock.Throw(what, why);
        lock.lock();
        continue;
      }
      if (!timed && now >= patience_ends) throw TransportError(what + " never matched (deadlock?)");
      // In flight on rated links: look again when it should be there, or
      // sooner (a message that finishes first leaves it more of the rate).
      auto wake = it != mail_.end()
                      ? std::min(network_->Expected(it->second.message), now + kRecheck)
                      : Clock::time_point::max();
      wake = timed ? clock.Deadline(wake) : std::min(wake, patience_ends);
      inbox_[std::get<1>(s)].wait_until(lock, wake);
    }
    Take(key, data, bytes);
    clock.Progress();
  }
  // Bytes of the next message on a stream that no receive has been posted
  // for, if it has arrived; -1 otherwise (MPI_Iprobe).
  int64_t Arrived(const Stream& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = mail_.find({s, receives_[s]});
    if (it == mail_.end() || !network_->Arrived(it->second.message)) return -1;
    return static_cast<int64_t>(it->second.bytes.size());
  }
  // Waits up to `most` for a message to `rank` to arrive.
  void Rest(int rank, std::chrono::microseconds most) {
    std::unique_lock<std::mutex> lock(mutex_);
    inbox_[rank].wait_for(lock, most);
  }
  // Collect if the message is there, without waiting.
  bool TryCollect(const Stream& s, int64_t seq, void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto key = std::make_pair(s, seq);
    auto it = mail_.find(key);
    if (it == mail_.end() || !network_->Arrived(it->second.message)) return false;
    Take(key, data, bytes);
    return true;
  }

 private:
  void Take(const std::pair<Stream, int64_t>& key, void* data, size_t bytes) {
    std::vector<char>& m = mail_[key].bytes;
    // MPI accepts a message shorter than the receive; the algorithms'
    // checks keep the sizes exact unless a test allows it.
    if (m.size() != bytes && !(allow_short_receives_ && m.size() < bytes)) {
      throw TransportError("message of " + std::to_string(m.size()) + " bytes for a receive of " +
                           std::to_string(bytes));
    }
    if (!m.empty()) std::memcpy(data, m.data(), m.size());
    mail_.erase(key);
  }

 public:
  // Every rank contributes bytes; every rank gets all contributions. When
  // the clock's judge gives up (or, without a timeout, after kPatience)
  // the rank withdraws its contribution and throws.
  std::vector<std::vector<char>> Exchange(int rank, std::vector<char> mine,
                                          ddl::PeerClock& clock) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    contributions_[rank] = std::move(mine);
    present_.resize(size_, false);
    present_[rank] = true;
    if (++arrived_count_ == size_) {
      result_ = contributions_;
      arrived_count_ = 0;
      present_.assign(size_, false);
      ++generation_;
      arrived_.notify_all();
      clock.Progress();
      return result_;
    }
    const auto patience_ends = Clock::now() + kPatience;
    clock.BeginWait();
    // As a transport knows whom its posted messages wait for: the ranks
    // (job-wide) that have not joined this operation.
    auto missing = [&] {
      std::vector<int> ranks;
      for (int r = 0; r < size_; ++r) {
        if (!present_[r] && r != rank) ranks.push_back(world_ranks_[r]);
      }
      return ranks;
    };
    auto withdraw = [&] {
      --arrived_count_;
      present_[rank] = false;
    };
    while (generation_ == generation) {
      const auto now = Clock::now();
      const bool timed = clock.timeout_s() > 0;
      if (timed && clock.Expired(now)) {
        const std::vector<int> awaited = missing();
        lock.unlock();
        const std::string why = clock.Judge("a group operation", awaited);
        lock.lock();
        if (generation_ != generation) break;
        if (!why.empty()) {
          withdraw();
          clock.Throw("a group operation", why, missing());
        }
        continue;
      }
      if (!timed && now >= patience_ends) {
        withdraw();
        throw TransportError("a group operation was not joined by every rank (deadlock?)");
      }
      arrived_.wait_until(lock, timed ? clock.Deadline(Clock::time_point::max()) : patience_ends);
    }
    clock.Progress();
    return result_;
  }

  // Runs fn(rank) on one thread per rank and rethrows the first failure.
  void Run(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    std::vector<std::string> failures(size_);
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        try {
          fn(r);
        } catch (const std::exception& e) {
          failures[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < size_; ++r) {
      if (!failures[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + failures[r]);
    }
  }

 private:
  static constexpr std::chrono::seconds kPatience{10};
  static constexpr std::chrono::milliseconds kRecheck{20};
  int size_;
  size_t max_message_bytes_;
  std::mutex mutex_;
  std::condition_variable arrived_;  // a group operation completed
  std::vector<std::condition_variable> inbox_;  // per rank: a message to it arrived
  std::map<Stream, int64_t> sends_, receives_;
  struct Mail {
    std::vector<char> bytes;
    int64_t message;  // its passage over the Network (Network::Send)
  };
  std::map<std::pair<Stream, int64_t>, Mail> mail_;
  std::vector<std::vector<char>> contributions_, result_;
  int arrived_count_ = 0;
  std::vector<bool> present_;  // ranks that joined the pending group operation
  int64_t generation_ = 0;
  std::vector<int> world_ranks_;  // of each rank of this group
  bool allow_short_receives_ = false;
  std::map<std::pair<int64_t, int>, std::shared_ptr<InProcessGroup>> children_;
  std::shared_ptr<Network> network_;
};

// Called by every thread-rank as it enters Split ("split") or
// SplitByMachine ("split by machine"), with its world rank: a check may
// hold one rank there (a rank that reaches a set-up step late, or never).
inline std::function<void(const char* step, int world_rank)>& SplitHook() {
  static std::function<void(const char*, int)> hook;
  return hook;
}

// The machine of each world rank as SplitByMachine sees it (null: every
// thread-rank on one machine, 0): a check may put a node's ranks on two.
inline std::function<int(int world_rank)>& MachineOf() {
  static std::function<int(int)> machine;
  return machine;
}

// One rank's view of the group. Sends are buffered (they complete at once);
// a receive completes in Wait. So a send buffer changed before its Wait,
// which MPI leaves undefined, goes unnoticed here.
class InProcessRank : public ddl::Group {
 public:
  InProcessRank(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
  // A rank of a group made by a split (kept alive by its ranks).
  InProcessRank(std::shared_ptr<InProcessGroup> group, int rank)
      : owned_(std::move(group)), group_(*owned_), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  int WorldRank(int r) const override { return group_.WorldRank(r); }
  size_t MaxMessageBytes() const override { return group_.max_message_bytes(); }

  Handle Isend(const void* data, size_t bytes, int peer, int tag) override {
    Check(peer, bytes);
    sent_bytes_ += bytes;
    InProcessGroup::Stream s{rank_, peer, tag};
    group_.Deliver(s, group_.NextSend(s), data, bytes);
    return Start({nullptr, 0, s, -1});
  }
  Handle Irecv(void* data, size_t bytes, int peer, int tag) override {
    Check(peer, bytes);
    InProcessGroup::Stream s{peer, rank_, tag};
    return Start({data, bytes, s, group_.NextReceive(s)});
  }
  void Wait(Handle h) override {
    Message& m = messages_.at(static_cast<size_t>(h));
    if (m.waited) return;
    if (m.seq >= 0) group_.Collect(m.stream, m.seq, m.data, m.bytes, clock_);
    m.waited = true;
    --outstanding_;
  }
  bool Test(Handle h) override {
    Message& m = messages_.at(static_cast<size_t>(h));
    if (!m.waited && m.seq >= 0 && !group_.TryCollect(m.stream, m.seq, m.data, m.bytes)) {
      // A polling caller (the rack pipeline) on a thread-rank: hundreds of
      // them would spend the machine's few cores polling each other, so a
      // miss rests until a message to this rank arrives, or a moment.
      group_.Rest(rank_, kTestRest);
      return false;
    }
    if (!m.waited) clock_.Progress();
    if (!m.waited) --outstanding_;
    m.waited = true;
    return true;
  }

  int64_t Probe(int peer, int tag) override {
    Check(peer, 1);
    return group_.Arrived({peer, rank_, tag});
  }

  // Group.
  std::unique_ptr<ddl::Group> Split(int color, int key) override {
    if (SplitHook()) SplitHook()("split", WorldRank(rank_));
    return SplitNow(color, key);
  }
  // Threads share one machine (unless MachineOf says otherwise).
  std::unique_ptr<ddl::Group> SplitByMachine(int key) override {
    if (SplitHook()) SplitHook()("split by machine", WorldRank(rank_));
    return SplitNow(MachineOf() ? MachineOf()(WorldRank(rank_)) : 0, key);
  }
  std::unique_ptr<ddl::Group> SplitNow(int color, int key) {
    const int64_t mine[2] = {color, key};
    const char* p = reinterpret_cast<const char*>(mine);
    auto all = Exchange(std::vector<char>(p, p + sizeof mine));
    const int64_t seq = splits_++;
    if (color < 0) return nullptr;
    std::vector<std::pair<int64_t, int>> members;  // (key, rank) of this color
    for (int r = 0; r < size(); ++r) {
      int64_t theirs[2];
      std::memcpy(theirs, all[r].data(), sizeof theirs);
      if (theirs[0] == color) members.emplace_back(theirs[1], r);
    }
    std::sort(members.begin(), members.end());
    std::vector<int> world_ranks;
    int new_rank = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
      world_ranks.push_back(WorldRank(members[i].second));
    }
    return std::make_unique<InProcessRank>(group_.Child(seq, color, std::move(world_ranks)),
                                           new_rank);
  }
  void Broadcast(void* data, size_t bytes, int root) override {
    const char* p = static_cast<const char*>(data);
    auto all = Exchange(rank_ == root ? std::vector<char>(p, p + bytes) : std::vector<char>());
    if (all[root].size() != bytes) {
      throw TransportError("broadcast of " + std::to_string(bytes) + " bytes, root sent " +
                           std::to_string(all[root].size()));
    }
    if (rank_ != root && bytes) std::memcpy(data, all[root].data(), bytes);
  }
  void AllgatherV(const void* mine, size_t my_bytes, void* out,
                  const std::vector<size_t>& bytes_per_rank) override {
    const char* p = static_cast<const char*>(mine);
    auto all = Exchange(std::vector<char>(p, p + my_bytes));
    char* dst = static_cast<char*>(out);
    for (int r = 0; r < size(); ++r) {
      if (all[r].size() != bytes_per_rank.at(r)) {
        throw TransportError("allgather: rank " + std::to_string(r) + " sent " +
                             std::to_string(all[r].size()) + " bytes, expected " +
                             std::to_string(bytes_per_rank[r]));
      }
      if (!all[r].empty()) std::memcpy(dst, all[r].data(), all[r].size());
      dst += all[r].size();
    }
  }
  void SetPeerTimeout(double seconds) override { clock_.SetTimeout(seconds); }
  double PeerTimeoutSeconds() const override { return clock_.timeout_s(); }
  void SetLiveness(ddl::Liveness* judge) override { clock_.SetLiveness(judge); }
  void SetSpinPolls(int) override {}
  // This world rank's bytes over the Network's links (every group of it).
  uint64_t MovedBytes() const override { return group_.network().MovedBytes(WorldRank(rank_)); }
  std::vector<int> PendingPeers() const override {
    std::vector<int> peers;
    for (const Message& m : messages_) {
      const int peer = WorldRank(std::get<0>(m.stream) == rank_ ? std::get<1>(m.stream)
                                                                : std::get<0>(m.stream));
      if (!m.waited && m.seq >= 0 && std::find(peers.begin(), peers.end(), peer) == peers.end()) {
        peers.push_back(peer);
      }
    }
    std::sort(peers.begin(), peers.end());
    return peers;
  }

  // What an algorithm's bounds are checked against: the most messages it
  // had started and not yet waited for at once, and its empty messages.
  int max_outstanding() const { return max_outstanding_; }
  int empty_messages() const { return empty_messages_; }
  // Bytes of every send so far.
  uint64_t sent_bytes() const { return sent_bytes_; }

  void AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool) override {
    const char* p = reinterpret_cast<const char*>(words.data());
    auto all = Exchange(std::vector<char>(p, p + words.size() * sizeof(uint64_t)));
    for (const auto& other : all) {
      if (other.size() != words.size() * sizeof(uint64_t)) {
        throw TransportError("AND over word vectors of different lengths");
      }
      const uint64_t* w = reinterpret_cast<const uint64_t*>(other.data());
      for (size_t i = 0; i < words.size(); ++i) words[i] &= w[i];
    }
  }
  std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine, int root) override {
    auto all = Exchange(mine);
    return rank_ == root ? all : std::vector<std::vector<char>>();
  }
  void BroadcastBytes(std::vector<char>& data, int root) override {
    data = Exchange(data)[root];
  }
  std::vector<int64_t> AllgatherInt64(int64_t mine) override {
    const char* p = reinterpret_cast<const char*>(&mine);
    std::vector<int64_t> out;
    for (const auto& v : Exchange(std::vector<char>(p, p + sizeof mine))) {
      int64_t x;
      std::memcpy(&x, v.data(), sizeof x);
      out.push_back(x);
    }
    return out;
  }

 private:
  std::vector<std::vector<char>> Exchange(std::vector<char> mine) {
    return group_.Exchange(rank_, std::move(mine), clock_);
  }
  struct Message {
    void* data;
    size_t bytes;
    InProcessGroup::Stream stream;
    int64_t seq;  // receive sequence; -1 for sends
    bool waited = false;
  };
  Handle Start(Message m) {
    messages_.push_back(m);
    max_outstanding_ = std::max(max_outstanding_, ++outstanding_);
    return static_cast<Handle>(messages_.size() - 1);
  }
  void Check(int peer, size_t bytes) {
    if (peer < 0 || peer >= group_.size() || peer == rank_) {
      throw TransportError("message to/from invalid peer " + std::to_string(peer));
    }
    if (bytes == 0) ++empty_messages_;
    if (bytes > group_.max_message_bytes()) {
      throw TransportError("message of " + std::to_string(bytes) + " bytes over the limit of " +
                           std::to_string(group_.max_message_bytes()));
    }
  }
  static constexpr std::chrono::microseconds kTestRest{1000};
  std::shared_ptr<InProcessGroup> owned_;  // null for a group the caller owns
  InProcessGroup& group_;
  int rank_;
  ddl::PeerClock clock_;
  int64_t splits_ = 0;  // splits of this group so far (the same on every rank)
  std::vector<Message> messages_;
  int outstanding_ = 0, max_outstanding_ = 0, empty_messages_ = 0;
  uint64_t sent_bytes_ = 0;
};

}  // namespace ddl_test
