#include "rack_allreduce.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "../common/reduce_kernels.h"
#include "../transport/tags.h"
#include "../transport/wait.h"
#include "ring.h"

namespace ddl {

namespace {

// n contiguous parts starting at element `first`: part p is elements
// [at[p], at[p + 1]) of the buffer.
std::vector<int64_t> PartStarts(int64_t first, int64_t count, int n) {
  const std::vector<int64_t> counts = EvenSegments(count, n);
  std::vector<int64_t> at(n + 1, first);
  for (int p = 0; p < n; ++p) at[p + 1] = at[p] + counts[p];
  return at;
}

// Rounds float32 values to float16 and back, in place (`scratch`: room
// for `count` float16 values).
void RoundThroughHalf(float* values, int64_t count, char* scratch) {
  Convert(scratch, DataType::kFloat16, values, DataType::kFloat32, count);
  Convert(values, DataType::kFloat32, scratch, DataType::kFloat16, count);
}

// The messages of one round over `t` still in flight.
class RoundMessages {
 public:
  explicit RoundMessages(Transport& t) : t_(t) {}
  void Add(Transport::Handle h) { handles_.push_back(h); }
  // Tests each message and forgets those that completed (Test releases a
  // completed handle); true when none is left. Never blocks.
  bool Done() {
    handles_.erase(std::remove_if(handles_.begin(), handles_.end(),
                                  [&](Transport::Handle h) { return t_.Test(h); }),
                   handles_.end());
    return handles_.empty();
  }
  // Blocks for the oldest message (the transport's peer timeout applies).
  void WaitOne() {
    if (handles_.empty()) return;
    t_.Wait(handles_.front());
    handles_.erase(handles_.begin());
  }
  void WaitAll() {
    for (Transport::Handle h : handles_) t_.Wait(h);
    handles_.clear();
  }

 private:
  Transport& t_;
  std::vector<Transport::Handle> handles_;
};

// One round of a reduce-scatter over `t`: part p of the range goes to rank
// p, and this rank combines every rank's copy of its own part in rank
// order. Start posts the messages; Finish waits, reduces and waits for the
// sends, so between the two the transport moves this round's bytes while
// the caller starts other rounds.
class ScatterRound {
 public:
  // `half`: a float32 buffer whose parts travel as float16 (stage B with
  // fp16 uplinks; see FinishHalf).
  ScatterRound(Transport& t, int tag, size_t elem, int64_t max_part, bool half = false)
      : t_(t), tag_(tag), elem_(elem), wire_(half ? 2 : elem), half_(half),
        landing_(static_cast<size_t>(std::max(t.size(), 1)) * max_part * wire_),
        staging_(half ? landing_.size() : 0), messages_(t) {}

  void Start(char* base, std::vector<int64_t> at) {
    at_ = std::move(at);
    const int me = t_.rank();
    const size_t mine = Bytes(me);
    // In half mode the whole range (this rank's own part too) is rounded
    // to float16 once, and the parts are sent from that copy.
    if (half_) {
      Convert(staging_.data(), DataType::kFloat16, base + at_.front() * elem_,
              DataType::kFloat32, at_.back() - at_.front());
    }
    for (int p = 0; p < t_.size(); ++p) {
      if (p == me) continue;
      if (mine > 0) messages_.Add(t_.Irecv(Landing(p), mine, p, tag_));
      if (Bytes(p) > 0) messages_.Add(t_.Isend(Outgoing(base, p), Bytes(p), p, tag_));
    }
    base_ = base;
  }

  // Between Start and Finish: whether the round's messages are done.
  RoundMessages& messages() { return messages_; }

  // Leaves this rank's part reduced (and divided by `divisor` if not 0).
  void Finish(DataType dtype, ReduceOp op, int divisor) {
    messages_.WaitAll();
    if (half_) return FinishHalf(op, divisor);
    const int n = t_.size();
    const int me = t_.rank();
    const int64_t count = at_[me + 1] - at_[me];
    char* dst = base_ + at_[me] * elem_;
    if (count > 0 && n > 1) {
      // This rank's own value goes to the last landing area (the one no
      // peer uses) unless it is the first summand and can stay in place.
      char* own = dst;
      if (me > 0) {
        own = Landing(me);
        std::memcpy(own, dst, count * elem_);
      }
      auto value = [&](int r) -> const char* { return r == me ? own : Landing(r); };
      if (me != 0) ReduceTo(dst, value(0), value(1), count, dtype, op);
      for (int r = me == 0 ? 1 : 2; r < n; ++r) ReduceInto(dst, value(r), count, dtype, op);
    }
    if (divisor > 0 && count > 0) DivideBy(dst, count, dtype, divisor);
  }

  const std::vector<int64_t>& at() const { return at_; }

 private:
  // Every rank's float16 copy of this rank's part (its own rounded in
  // Start) widened back to float32 and combined in rank order in float32,
  // divided once, then rounded to float16 again: the part holds float32
  // values that float16 represents exactly, the same bits on the owner as
  // on the ranks that receive them in float16 (stage C).
  void FinishHalf(ReduceOp op, int divisor) {
    const int n = t_.size();
    const int me = t_.rank();
    const int64_t count = at_[me + 1] - at_[me];
    if (count == 0) return;
    float* dst = reinterpret_cast<float*>(base_ + at_[me] * elem_);
    auto value = [&](int r) -> const char* {
      return r == me ? staging_.data() + (at_[me] - at_.front()) * wire_ : Landing(r);
    };
    Convert(dst, DataType::kFloat32, value(0), DataType::kFloat16, count);
    if (widened_.size() < static_cast<size_t>(count)) widened_.resize(count);
    for (int r = 1; r < n; ++r) {
      Convert(widened_.data(), DataType::kFloat32, value(r), DataType::kFloat16, count);
      ReduceInto(dst, widened_.data(), count, DataType::kFloat32, op);
    }
    if (divisor > 0) DivideBy(dst, count, DataType::kFloat32, divisor);
    RoundThroughHalf(dst, count, staging_.data() + (at_[me] - at_.front()) * wire_);
  }

  size_t Bytes(int p) const { return static_cast<size_t>(at_[p + 1] - at_[p]) * wire_; }
  const char* Outgoing(const char* base, int p) const {
    return half_ ? staging_.data() + (at_[p] - at_.front()) * wire_ : base + at_[p] * elem_;
  }
  // Peer p's copy of this rank's part; index me (unused by any peer) holds
  // this rank's own copy when it needs one.
  char* Landing(int p) {
    return landing_.data() + static_cast<size_t>(p) * (landing_.size() / std::max(t_.size(), 1));
  }

  Transport& t_;
  int tag_;
  size_t elem_;
  size_t wire_;  // bytes per element on the wire: elem_, or 2 in half mode
  bool half_;
  std::vector<char> landing_;
  std::vector<char> staging_;   // half mode: the range in float16, sent from here
  std::vector<float> widened_;  // half mode: one rank's copy back in float32
  std::vector<int64_t> at_;
  char* base_ = nullptr;
  RoundMessages messages_;
};

// One round of an all-gather over `t`: rank p's part goes to every rank,
// straight into its place in the buffer.
class GatherRound {
 public:
  // `half`: a float32 buffer gathered as float16 (stage C with fp16
  // uplinks) through a slot of `max_range` elements; each part must hold
  // values float16 represents exactly (FinishHalf of stage B).
  GatherRound(Transport& t, int tag, size_t elem, bool half = false, int64_t max_range = 0)
      : t_(t), tag_(tag), elem_(elem), wire_(half ? 2 : elem), half_(half),
        staging_(half ? static_cast<size_t>(max_range) * wire_ : 0), messages_(t) {}

  void Start(char* base, const std::vector<int64_t>& at) {
    const int me = t_.rank();
    at_ = at;
    base_ = base;
    auto bytes = [&](int p) { return static_cast<size_t>(at[p + 1] - at[p]) * wire_; };
    auto place = [&](int p) {
      return half_ ? staging_.data() + (at[p] - at.front()) * wire_ : base + at[p] * elem_;
    };
    if (half_) {  // exact: the part is float16 values already
      Convert(place(me), DataType::kFloat16, base + at[me] * elem_, DataType::kFloat32,
              at[me + 1] - at[me]);
    }
    for (int p = 0; p < t_.size(); ++p) {
      if (p == me) continue;
      if (bytes(p) > 0) messages_.Add(t_.Irecv(place(p), bytes(p), p, tag_));
      if (bytes(me) > 0) messages_.Add(t_.Isend(place(me), bytes(me), p, tag_));
    }
  }
  RoundMessages& messages() { return messages_; }
  void Finish() {
    messages_.WaitAll();
    if (!half_) return;
    // The other ranks' parts, widened into their places in the buffer.
    for (int p = 0; p < t_.size(); ++p) {
      if (p == t_.rank()) continue;
      Convert(base_ + at_[p] * elem_, DataType::kFloat32,
              staging_.data() + (at_[p] - at_.front()) * wire_, DataType::kFloat16,
              at_[p + 1] - at_[p]);
    }
  }

 private:
  Transport& t_;
  int tag_;
  size_t elem_;
  size_t wire_;
  bool half_;
  std::vector<char> staging_;  // half mode: the range in float16
  std::vector<int64_t> at_;
  char* base_ = nullptr;
  RoundMessages messages_;
};

}  // namespace

void RackOrderedExchange(Transport& all, int nodes_per_rack, void* buffer, int64_t count,
                         DataType dtype, ReduceOp op, bool half_uplinks) {
  const int n = all.size();
  if (n == 1 || count == 0) return;
  const size_t elem = DataTypeSize(dtype);
  const size_t bytes = static_cast<size_t>(count) * elem;
  // parts[r]: rank r's buffer (this rank's own is a copy: the sends read
  // `buffer` until they complete); one more part for a rack's partial sum.
  std::vector<char> parts(static_cast<size_t>(n + 1) * bytes);
  auto part = [&](int r) { return parts.data() + static_cast<size_t>(r) * bytes; };
  ExchangeBuffers(all, buffer, bytes, elem, parts.data(), kTagRackExchange);
  const ReduceOp sum_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  // Rack r's nodes are ranks [r x N, (r + 1) x N): their partial in node
  // order, then folded into the total in rack order.
  char* partial = part(n);
  const int racks = n / nodes_per_rack;
  // The rounding of fp16 uplinks (RackAllreduce), though this path sends
  // float32: a tensor gets the same bits whichever path its call took.
  const bool half = half_uplinks && dtype == DataType::kFloat32 && racks > 1;
  std::vector<char> scratch(half ? count * 2 : 0);
  for (int r = 0; r < racks; ++r) {
    char* into = r == 0 ? static_cast<char*>(buffer) : partial;
    const int first = r * nodes_per_rack;
    std::memcpy(into, part(first), bytes);
    for (int k = 1; k < nodes_per_rack; ++k) ReduceInto(into, part(first + k), count, dtype, sum_op);
    if (half) RoundThroughHalf(reinterpret_cast<float*>(into), count, scratch.data());
    if (r > 0) ReduceInto(buffer, partial, count, dtype, sum_op);
  }
  if (op == ReduceOp::kAverage) DivideBy(buffer, count, dtype, n);
  if (half) RoundThroughHalf(static_cast<float*>(buffer), count, scratch.data());
}

size_t RackPieceBytes(size_t call_bytes) {
  return std::min(std::max<size_t>(call_bytes, 1), kRackPieceBytes);
}

size_t RackSlicePieceBytes(size_t slice_bytes) {
  return std::clamp<size_t>(slice_bytes / 8, 64 << 10, 2 << 20);
}

const char* RackGridAllreduce(const RackGrid& grid, void* buffer, int64_t count, DataType dtype,
                              ReduceOp op, size_t piece_bytes, NetworkChoice choice) {
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  // The size rule's pieces: the caller's (a node's chunk cuts its slice
  // itself), else RackPieceBytes of the call.
  const size_t rule_piece = piece_bytes > 0 ? piece_bytes : RackPieceBytes(bytes);
  // fp16 on the uplinks: the grid's setting (DDL_UPLINK_COMPRESSION=fp16)
  // or the autotuner's candidate; float32 buffers only.
  const bool half = (grid.half_uplinks || choice == NetworkChoice::kRackPipelineSizedFp16Up) &&
                    dtype == DataType::kFloat32 && grid.across->size() > 1;
  auto named = [half](const char* plain, const char* fp16) { return half ? fp16 : plain; };
  switch (choice) {
    case NetworkChoice::kRackPipeline256K:
      RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, 256 << 10, half);
      return named("RACK_ALLREDUCE_256K", "RACK_ALLREDUCE_256K_FP16UP");
    case NetworkChoice::kRackPipeline1M:
      RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, 1 << 20, half);
      return named("RACK_ALLREDUCE_1M", "RACK_ALLREDUCE_1M_FP16UP");
    case NetworkChoice::kRackPipelineSized:
    case NetworkChoice::kRackPipelineSizedFp16Up:
      RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, rule_piece, half);
      return named("RACK_ALLREDUCE_SIZED", "RACK_ALLREDUCE_SIZED_FP16UP");
    default:
      break;
  }
  const bool small = static_cast<size_t>(grid.all->size() - 1) * bytes <= kRackDirectExchangeBytes;
  // Any other choice (kAuto, or one for another step) is the size rule.
  if (choice == NetworkChoice::kRackExchange || small) {
    RackOrderedExchange(*grid.all, grid.rack->size(), buffer, count, dtype, op, half);
    return named("RACK_ORDERED_EXCHANGE", "RACK_ORDERED_EXCHANGE_FP16UP");
  }
  RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, rule_piece, half);
  return named("RACK_ALLREDUCE", "RACK_ALLREDUCE_FP16UP");
}

void RackAllreduce(Transport& rack, Transport& across, void* buffer, int64_t count,
                   DataType dtype, ReduceOp op, size_t piece_bytes, bool half_uplinks) {
  const int nodes = rack.size();
  const int racks = across.size();
  if (count == 0 || nodes * racks == 1) return;
  // With one rack nothing crosses an uplink: no rounding.
  const bool half = half_uplinks && dtype == DataType::kFloat32 && racks > 1;
  const size_t elem = DataTypeSize(dtype);
  char* base = static_cast<char*>(buffer);
  // A piece's parts in the rack are its largest messages: at most
  // ceil(piece / nodes) elements, so a piece of nodes x (the largest
  // message) keeps every message within the transport's limit.
  const int64_t max_message = static_cast<int64_t>(
      std::max<size_t>(1, std::min(rack.MaxMessageBytes(), across.MaxMessageBytes()) / elem));
  const int64_t piece = std::max<int64_t>(
      1, std::min<int64_t>({static_cast<int64_t>(piece_bytes / elem), nodes * max_message, count}));
  const int64_t pieces = (count + piece - 1) / piece;
  const int64_t max_segment = (piece + nodes - 1) / nodes;
  const int64_t max_sub = (max_segment + racks - 1) / racks;
  // Sums first; the rank owning a sub-segment after B divides it once.
  const ReduceOp sum_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  const int divisor = op == ReduceOp::kAverage ? nodes * racks : 0;

  // Each stage keeps up to kRackRoundsInFlight pieces in flight, in slot
  // piece % that, and starts pieces in piece order on every rank: the k-th
  // message between two ranks on a stage's tag is then piece k's at both
  // ends, whichever order the stages of different pieces move in.
  // (A call of fewer pieces needs fewer slots: each holds a piece's
  // landing areas.)
  const int slots = static_cast<int>(std::min<int64_t>(kRackRoundsInFlight, pieces));
  const int me = rack.rank();
  std::vector<ScatterRound> rack_scatter, across_scatter;     // A, B
  std::vector<GatherRound> across_gather, rack_gather;        // C, D
  for (int i = 0; i < slots; ++i) {
    rack_scatter.emplace_back(rack, kTagRackScatter, elem, max_segment);
    across_scatter.emplace_back(across, kTagAcrossScatter, elem, max_sub, half);
    across_gather.emplace_back(across, kTagAcrossGather, elem, half, max_segment);
    rack_gather.emplace_back(rack, kTagRackGather, elem);
  }
  // Piece p's segments in the rack and sub-segments across racks, from its
  // A (or B) until its D (or C).
  std::vector<std::vector<int64_t>> segments(pieces), subs(pieces);

  enum Stage { kA, kB, kC, kD, kStages };
  auto start = [&](int stage, int64_t p) {
    const int slot = static_cast<int>(p % slots);
    switch (stage) {
      case kA: {
        const int64_t first = p * piece;
        segments[p] = PartStarts(first, std::min(piece, count - first), nodes);
        rack_scatter[slot].Start(base, segments[p]);
        break;
      }
      case kB: {
        const std::vector<int64_t>& seg = segments[p];
        subs[p] = PartStarts(seg[me], seg[me + 1] - seg[me], racks);
        across_scatter[slot].Start(base, subs[p]);
        break;
      }
      case kC: across_gather[slot].Start(base, subs[p]); break;
      default: rack_gather[slot].Start(base, segments[p]); break;
    }
  };
  auto messages = [&](int stage, int64_t p) -> RoundMessages& {
    const int slot = static_cast<int>(p % slots);
    switch (stage) {
      case kA: return rack_scatter[slot].messages();
      case kB: return across_scatter[slot].messages();
      case kC: return across_gather[slot].messages();
      default: return rack_gather[slot].messages();
    }
  };
  auto finish = [&](int stage, int64_t p) {
    const int slot = static_cast<int>(p % slots);
    switch (stage) {
      case kA: rack_scatter[slot].Finish(dtype, sum_op, 0); break;
      // The sub-segment this rank owns is final here: divided once.
      case kB: across_scatter[slot].Finish(dtype, sum_op, divisor); break;
      case kC: across_gather[slot].Finish(); subs[p] = {}; break;
      default: rack_gather[slot].Finish(); segments[p] = {}; break;
    }
  };

  // Pieces in flight per stage, oldest first, and pieces done with the
  // stage before, waiting for a slot.
  std::deque<int64_t> flight[kStages], queued[kStages];
  int64_t admitted = 0, finished = 0;
  // The uplinks are where a piece's round waits longest.
  PipelineIdle backoff(across.PeerTimeoutSeconds());
  // Every rank moves each piece on as soon as its own round of it is done,
  // with no step shared by the stages: a round waits only for the messages
  // of its piece, never for a slow message of another stage, so the
  // uplinks keep up to slots pieces queued while the rack rounds run. A
  // posted receive is always matched: the peer posts the same round once
  // its earlier stages of that piece are done, and the oldest piece in
  // flight anywhere has every earlier stage done on every rank.
  while (finished < pieces) {
    bool moved = false;
    for (int stage = kD; stage >= kA; --stage) {
      while (!flight[stage].empty() && messages(stage, flight[stage].front()).Done()) {
        const int64_t p = flight[stage].front();
        flight[stage].pop_front();
        finish(stage, p);
        if (stage == kD) ++finished;
        else queued[stage + 1].push_back(p);
        moved = true;
      }
    }
    for (int stage = kB; stage <= kD; ++stage) {
      while (!queued[stage].empty() && static_cast<int>(flight[stage].size()) < slots) {
        start(stage, queued[stage].front());
        flight[stage].push_back(queued[stage].front());
        queued[stage].pop_front();
        moved = true;
      }
    }
    // A runs over the fast node links; admitting pieces only while few
    // wait for B keeps it from racing through the call and taking the
    // node links from the D rounds that finish pieces.
    while (admitted < pieces && static_cast<int>(flight[kA].size()) < slots &&
           static_cast<int>(queued[kB].size()) < slots) {
      start(kA, admitted);
      flight[kA].push_back(admitted++);
      moved = true;
    }
    if (moved) {
      backoff.Reset();
    } else if (backoff.Idle()) {
      // Nothing completed for a long while: block on the oldest piece's
      // round, whose wait applies the transport's peer timeout (a dead
      // peer ends in an error, not a hang).
      int oldest = -1;
      for (int stage = kA; stage < kStages; ++stage) {
        if (!flight[stage].empty() &&
            (oldest < 0 || flight[stage].front() < flight[oldest].front())) {
          oldest = stage;
        }
      }
      messages(oldest, flight[oldest].front()).WaitOne();
      backoff.Reset();
    }
  }
}

}  // namespace ddl
