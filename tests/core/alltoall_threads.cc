// PairwiseAlltoall and ExchangeCounts over an in-memory transport with one
// thread per rank (no MPI): every rank's output against the definition,
// for 1..5 ranks, random splits with zeros, blocks of many chunks. The
// transport also checks the algorithm's bounds: no message above
// MaxMessageBytes, and at most kMaxOutstanding messages started and not
// yet waited for per rank. Exits non-zero on a mismatch.
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "algorithms/alltoall.h"

using namespace ddl;

namespace {

constexpr size_t kMaxMessage = 1000;  // small, so blocks go in many chunks
constexpr int kMaxOutstanding = 16;   // the algorithm's window, both directions

// Sends are buffered (a copy is queued at Isend), receives complete in Wait
// once a message with the same (from, to, tag) is queued: MPI's matching
// order for one pair and tag.
class Mailboxes {
 public:
  void Put(int from, int to, int tag, const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const char* p = static_cast<const char*>(data);
    queues_[{from, to, tag}].emplace_back(p, p + bytes);
    arrived_.notify_all();
  }
  std::vector<char> Take(int from, int to, int tag) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& q = queues_[{from, to, tag}];
    arrived_.wait(lock, [&] { return !q.empty(); });
    std::vector<char> message = std::move(q.front());
    q.pop_front();
    return message;
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> queues_;
};

class ThreadTransport : public Transport {
 public:
  ThreadTransport(Mailboxes& boxes, int rank, int size) : boxes_(boxes), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t MaxMessageBytes() const override { return kMaxMessage; }
  Handle Isend(const void* data, size_t bytes, int peer, int tag) override {
    Check(bytes);
    boxes_.Put(rank_, peer, tag, data, bytes);
    return Start({nullptr, 0, peer, tag});
  }
  Handle Irecv(void* data, size_t bytes, int peer, int tag) override {
    Check(bytes);
    return Start({data, bytes, peer, tag});
  }
  void Wait(Handle h) override {
    Pending p = pending_[h];
    if (p.data != nullptr || p.bytes != 0) {
      std::vector<char> message = boxes_.Take(p.peer, rank_, p.tag);
      if (message.size() != p.bytes) ++errors;
      std::memcpy(p.data, message.data(), std::min(message.size(), p.bytes));
    }
    --outstanding_;
  }
  long errors = 0;

 private:
  struct Pending {
    void* data;
    size_t bytes;
    int peer;
    int tag;
  };
  void Check(size_t bytes) {
    if (bytes > kMaxMessage || bytes == 0) ++errors;  // zero-byte messages are skipped
  }
  Handle Start(Pending p) {
    if (++outstanding_ > kMaxOutstanding) ++errors;
    pending_.push_back(p);
    return static_cast<Handle>(pending_.size() - 1);
  }
  Mailboxes& boxes_;
  int rank_, size_;
  int outstanding_ = 0;
  std::vector<Pending> pending_;
};

long RunOnce(int n, std::mt19937& rng) {
  const size_t row = 1 + rng() % 300;  // bytes per row
  // splits[r][p]: rows rank r sends to rank p; about a third are zero.
  std::vector<std::vector<int64_t>> splits(n, std::vector<int64_t>(n));
  for (auto& to : splits)
    for (auto& rows : to) rows = rng() % 3 == 0 ? 0 : rng() % 40;
  std::vector<std::vector<char>> inputs(n), outputs(n);
  for (int r = 0; r < n; ++r) {
    int64_t rows = 0;
    for (int64_t s : splits[r]) rows += s;
    inputs[r].resize(rows * row);
    for (char& c : inputs[r]) c = static_cast<char>(rng());
  }
  Mailboxes boxes;
  std::vector<long> errors(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ThreadTransport t(boxes, r, n);
      std::vector<int64_t> from_each = ExchangeCounts(t, splits[r]);
      std::vector<size_t> send(n), recv(n);
      size_t total = 0;
      for (int p = 0; p < n; ++p) {
        if (from_each[p] != splits[p][r]) ++errors[r];
        send[p] = splits[r][p] * row;
        recv[p] = from_each[p] * row;
        total += recv[p];
      }
      outputs[r].resize(total);
      PairwiseAlltoall(t, inputs[r].data(), send, outputs[r].data(), recv);
      errors[r] += t.errors;
    });
  }
  for (auto& th : threads) th.join();
  long wrong = 0;
  for (int r = 0; r < n; ++r) {
    wrong += errors[r];
    // The definition: rank r's output is, for p in order, the rows of
    // rank p's input that follow the rows p sent to ranks before r.
    std::vector<char> expected;
    for (int p = 0; p < n; ++p) {
      int64_t before = 0;
      for (int q = 0; q < r; ++q) before += splits[p][q];
      auto first = inputs[p].begin() + before * row;
      expected.insert(expected.end(), first, first + splits[p][r] * row);
    }
    wrong += expected != outputs[r];
  }
  return wrong;
}

}  // namespace

int main() {
  std::mt19937 rng(3);
  long wrong = 0;
  int runs = 0;
  for (int n = 1; n <= 5; ++n) {
    for (int k = 0; k < 6; ++k, ++runs) wrong += RunOnce(n, rng);
  }
  std::printf("alltoall over threads: %ld mismatches in %d runs\n", wrong, runs);
  return wrong == 0 ? 0 : 1;
}
