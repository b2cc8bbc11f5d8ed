// Threads as ranks: a Transport and a ControlPlane over the memory of one
// process, so the core's algorithms, negotiation and node setup run
// without MPI or TensorFlow. Messages between a pair of ranks with one tag
// match in posting order, as MPI's do. Every wait gives up after a few
// seconds with TransportError, so a deadlock in the code under test fails
// the check instead of hanging it.
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

#include "transport/control_plane.h"
#include "transport/transport.h"

namespace ddl_test {

using ddl::TransportError;

// State shared by the ranks of one group.
class InProcessGroup {
 public:
  InProcessGroup(int size, size_t max_message_bytes)
      : size_(size), max_message_bytes_(max_message_bytes), contributions_(size) {}
  int size() const { return size_; }
  size_t max_message_bytes() const { return max_message_bytes_; }

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
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const char* p = static_cast<const char*>(data);
      mail_[{s, seq}].assign(p, p + bytes);
    }
    arrived_.notify_all();
  }
  void Collect(const Stream& s, int64_t seq, void* data, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto key = std::make_pair(s, seq);
    if (!arrived_.wait_for(lock, kPatience, [&] { return mail_.count(key) > 0; })) {
      throw TransportError("receive from rank " + std::to_string(std::get<0>(s)) + " with tag " +
                           std::to_string(std::get<2>(s)) + " never matched (deadlock?)");
    }
    std::vector<char>& m = mail_[key];
    if (m.size() != bytes) {
      throw TransportError("message of " + std::to_string(m.size()) + " bytes for a receive of " +
                           std::to_string(bytes));
    }
    if (bytes) std::memcpy(data, m.data(), bytes);
    mail_.erase(key);
  }

  // Every rank contributes bytes; every rank gets all contributions.
  std::vector<std::vector<char>> Exchange(int rank, std::vector<char> mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    contributions_[rank] = std::move(mine);
    if (++arrived_count_ == size_) {
      result_ = contributions_;
      arrived_count_ = 0;
      ++generation_;
      arrived_.notify_all();
    } else if (!arrived_.wait_for(lock, kPatience, [&] { return generation_ != generation; })) {
      throw TransportError("a group operation was not joined by every rank (deadlock?)");
    }
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
  int size_;
  size_t max_message_bytes_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<Stream, int64_t> sends_, receives_;
  std::map<std::pair<Stream, int64_t>, std::vector<char>> mail_;
  std::vector<std::vector<char>> contributions_, result_;
  int arrived_count_ = 0;
  int64_t generation_ = 0;
};

// One rank's view of the group. Sends are buffered (they complete at once);
// a receive completes in Wait. So a send buffer changed before its Wait,
// which MPI leaves undefined, goes unnoticed here.
class InProcessRank : public ddl::Transport, public ddl::ControlPlane {
 public:
  InProcessRank(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  int WorldRank(int r) const override { return r; }
  size_t MaxMessageBytes() const override { return group_.max_message_bytes(); }

  Handle Isend(const void* data, size_t bytes, int peer, int tag) override {
    Check(peer, bytes);
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
    if (m.seq >= 0) group_.Collect(m.stream, m.seq, m.data, m.bytes);
    m.waited = true;
    --outstanding_;
  }

  // What an algorithm's bounds are checked against: the most messages it
  // had started and not yet waited for at once, and its empty messages.
  int max_outstanding() const { return max_outstanding_; }
  int empty_messages() const { return empty_messages_; }

  void AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool) override {
    const char* p = reinterpret_cast<const char*>(words.data());
    auto all = group_.Exchange(rank_, std::vector<char>(p, p + words.size() * sizeof(uint64_t)));
    for (const auto& other : all) {
      if (other.size() != words.size() * sizeof(uint64_t)) {
        throw TransportError("AND over word vectors of different lengths");
      }
      const uint64_t* w = reinterpret_cast<const uint64_t*>(other.data());
      for (size_t i = 0; i < words.size(); ++i) words[i] &= w[i];
    }
  }
  std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine, int root) override {
    auto all = group_.Exchange(rank_, mine);
    return rank_ == root ? all : std::vector<std::vector<char>>();
  }
  void BroadcastBytes(std::vector<char>& data, int root) override {
    data = group_.Exchange(rank_, data)[root];
  }
  std::vector<int64_t> AllgatherInt64(int64_t mine) override {
    const char* p = reinterpret_cast<const char*>(&mine);
    std::vector<int64_t> out;
    for (const auto& v : group_.Exchange(rank_, std::vector<char>(p, p + sizeof mine))) {
      int64_t x;
      std::memcpy(&x, v.data(), sizeof x);
      out.push_back(x);
    }
    return out;
  }

 private:
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
  InProcessGroup& group_;
  int rank_;
  std::vector<Message> messages_;
  int outstanding_ = 0, max_outstanding_ = 0, empty_messages_ = 0;
};

}  // namespace ddl_test
