#include "chain_allreduce.h"

#include <algorithm>
#include <deque>
#include <vector>

#include "../common/reduce_kernels.h"
#include "../transport/tags.h"
#include "../transport/wait.h"

namespace ddl {

namespace {

// A message of the chain and the piece it carries; `done` once Test or
// Wait saw it complete (the transport then released the handle).
struct Message {
  int64_t piece;
  Transport::Handle handle;
  bool done = false;
};

// Messages of one kind in posting order. The chain acts on them in piece
// order, so only the oldest is ever tested.
class MessageQueue {
 public:
  explicit MessageQueue(Transport& t) : t_(t) {}
  void Add(int64_t piece, Transport::Handle h) { queue_.push_back({piece, h}); }
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  // Whether the oldest message completed; never blocks.
  bool FrontDone() {
    if (queue_.empty()) return false;
    Message& m = queue_.front();
    if (!m.done) m.done = t_.Test(m.handle);
    return m.done;
  }
  // Blocks for the oldest message (the transport's peer timeout applies);
  // false if there was nothing left to wait for.
  bool WaitFront() {
    if (queue_.empty() || queue_.front().done) return false;
    t_.Wait(queue_.front().handle);
    queue_.front().done = true;
    return true;
  }
  int64_t PopFront() {
    const int64_t piece = queue_.front().piece;
    queue_.pop_front();
    return piece;
  }
  void WaitAll() {
    for (Message& m : queue_) {
      if (!m.done) t_.Wait(m.handle);
    }
    queue_.clear();
  }

 private:
  Transport& t_;
  std::deque<Message> queue_;
};

}  // namespace

size_t ChainPieceBytes(size_t call_bytes, int ranks) {
  const size_t hops = static_cast<size_t>(std::max(ranks - 1, 1));
  const size_t piece = std::clamp<size_t>(call_bytes / (8 * hops), 64 << 10, 1 << 20);
  return std::min(std::max<size_t>(call_bytes, 1), piece);
}

void ChainAllreduceSized(Transport& t, void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  ChainAllreduce(t, buffer, count, dtype, op, 0);
}

void ChainAllreduce(Transport& t, void* buffer, int64_t count, DataType dtype, ReduceOp op,
                    size_t piece_bytes) {
  const int n = t.size();
  const int me = t.rank();
  if (n == 1 || count == 0) return;
  const size_t elem = DataTypeSize(dtype);
  if (piece_bytes == 0) piece_bytes = ChainPieceBytes(static_cast<size_t>(count) * elem, n);
  const int64_t max_message = static_cast<int64_t>(std::max<size_t>(1, t.MaxMessageBytes() / elem));
  const int64_t piece = std::max<int64_t>(
      1, std::min<int64_t>({static_cast<int64_t>(piece_bytes / elem), max_message, count}));
  const int64_t pieces = (count + piece - 1) / piece;
  const int window = static_cast<int>(std::min<int64_t>(kChainPiecesInFlight, pieces));
  const bool first = me == 0;
  const bool last = me == n - 1;
  const int left = me - 1, right = me + 1;
  // Sums up the chain; the last rank divides each finished piece once.
  const ReduceOp sum_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  char* const base = static_cast<char*>(buffer);
  auto at = [&](int64_t k) { return base + k * piece * elem; };
  auto length = [&](int64_t k) { return std::min(piece, count - k * piece); };
  const size_t slot_bytes = static_cast<size_t>(piece) * elem;
  // Partials from the left land in slot k % window; a rank in the middle
  // sends its own partial from another slot, so the piece's place in the
  // buffer is free for the result as soon as the partial is made.
  std::vector<char> landing(first ? 0 : window * slot_bytes);
  std::vector<char> outgoing(first || last ? 0 : window * slot_bytes);
  auto landed = [&](int64_t k) { return landing.data() + (k % window) * slot_bytes; };
  auto partial = [&](int64_t k) { return outgoing.data() + (k % window) * slot_bytes; };

  MessageQueue up_recv(t), up_send(t), down_recv(t), down_send(t);
  int64_t posted = 0;    // partials from the left with a receive posted
  int64_t made = 0;      // pieces whose partial (or, on the last rank, result) is made
  int64_t results = 0;   // results this rank holds
  PipelineIdle backoff(t.PeerTimeoutSeconds());
  // Every rank posts each stream's messages in piece order, so the k-th
  // message between two neighbours on a tag is piece k's at both ends. A
  // message waited for never depends on this rank acting again: a partial
  // from the left needs only the ranks before it; a result from the
  // right needs the partial this rank already sent; a send completes once
  // its neighbour, having made the piece before, posted the receive.
  while (results < pieces) {
    bool moved = false;
    // Receives for the next partials from the left, `window` ahead.
    while (!first && posted < pieces && posted - made < window) {
      up_recv.Add(posted, t.Irecv(landed(posted), length(posted) * elem, left, kTagChainUp));
      ++posted;
      moved = true;
    }
    // Make the next pieces: rank 0 sends its own values; the others add
    // theirs to the partial of the ranks before ((x0 op x1) op ...) and
    // pass it on, or, on the last rank, finish it and send it back.
    while (made < pieces && up_send.size() < static_cast<size_t>(window) &&
           (first || up_recv.FrontDone())) {
      const int64_t k = made;
      if (first) {
        up_send.Add(k, t.Isend(at(k), length(k) * elem, right, kTagChainUp));
      } else {
        up_recv.PopFront();
        if (last) {
          ReduceTo(at(k), landed(k), at(k), length(k), dtype, sum_op);
          if (op == ReduceOp::kAverage) DivideBy(at(k), length(k), dtype, n);
          down_send.Add(k, t.Isend(at(k), length(k) * elem, left, kTagChainDown));
          ++results;
        } else {
          ReduceTo(partial(k), landed(k), at(k), length(k), dtype, sum_op);
          up_send.Add(k, t.Isend(partial(k), length(k) * elem, right, kTagChainUp));
          down_recv.Add(k, t.Irecv(at(k), length(k) * elem, right, kTagChainDown));
        }
      }
      ++made;
      moved = true;
    }
    // Sent partials: rank 0 sent from the buffer itself, so only now may
    // the result land there.
    while (up_send.FrontDone()) {
      const int64_t k = up_send.PopFront();
      if (first) down_recv.Add(k, t.Irecv(at(k), length(k) * elem, right, kTagChainDown));
      moved = true;
    }
    // Results from the right: kept in place, passed on to the left.
    while (down_recv.FrontDone()) {
      const int64_t k = down_recv.PopFront();
      if (!first) down_send.Add(k, t.Isend(at(k), length(k) * elem, left, kTagChainDown));
      ++results;
      moved = true;
    }
    while (down_send.FrontDone()) {
      down_send.PopFront();
      moved = true;
    }
    if (moved) {
      backoff.Reset();
    } else if (results < pieces && backoff.Idle()) {
      // Nothing moved for a long while: block on what is needed next (the
      // transport's wait applies the peer timeout, so a dead neighbour
      // ends in an error, not a hang).
      up_recv.WaitFront() || up_send.WaitFront() || down_recv.WaitFront() ||
          down_send.WaitFront();
      backoff.Reset();
    }
  }
  up_send.WaitAll();
  down_send.WaitAll();
}

}  // namespace ddl
