#include "rack_allreduce.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "../common/reduce_kernels.h"
#include "../transport/tags.h"
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

// One round of a reduce-scatter over `t`: part p of the range goes to rank
// p, and this rank combines every rank's copy of its own part in rank
// order. Start posts the messages; Finish waits, reduces and waits for the
// sends, so between the two the transport moves this round's bytes while
// the caller starts other rounds.
class ScatterRound {
 public:
  ScatterRound(Transport& t, int tag, size_t elem, int64_t max_part)
      : t_(t), tag_(tag), elem_(elem),
        landing_(static_cast<size_t>(std::max(t.size(), 1)) * max_part * elem) {}

  void Start(char* base, std::vector<int64_t> at) {
    at_ = std::move(at);
    const int me = t_.rank();
    const size_t mine = Bytes(me);
    handles_.clear();
    for (int p = 0; p < t_.size(); ++p) {
      if (p == me) continue;
      if (mine > 0) handles_.push_back(t_.Irecv(Landing(p), mine, p, tag_));
      if (Bytes(p) > 0) handles_.push_back(t_.Isend(base + at_[p] * elem_, Bytes(p), p, tag_));
    }
    base_ = base;
  }

  // Leaves this rank's part reduced (and divided by `divisor` if not 0).
  void Finish(DataType dtype, ReduceOp op, int divisor) {
    for (Transport::Handle h : handles_) t_.Wait(h);
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
  size_t Bytes(int p) const { return static_cast<size_t>(at_[p + 1] - at_[p]) * elem_; }
  // Peer p's copy of this rank's part; index me (unused by any peer) holds
  // this rank's own copy when it needs one.
  char* Landing(int p) {
    return landing_.data() + static_cast<size_t>(p) * (landing_.size() / std::max(t_.size(), 1));
  }

  Transport& t_;
  int tag_;
  size_t elem_;
  std::vector<char> landing_;
  std::vector<int64_t> at_;
  char* base_ = nullptr;
  std::vector<Transport::Handle> handles_;
};

// One round of an all-gather over `t`: rank p's part goes to every rank,
// straight into its place in the buffer.
class GatherRound {
 public:
  GatherRound(Transport& t, int tag, size_t elem) : t_(t), tag_(tag), elem_(elem) {}

  void Start(char* base, const std::vector<int64_t>& at) {
    const int me = t_.rank();
    auto bytes = [&](int p) { return static_cast<size_t>(at[p + 1] - at[p]) * elem_; };
    handles_.clear();
    for (int p = 0; p < t_.size(); ++p) {
      if (p == me) continue;
      if (bytes(p) > 0) handles_.push_back(t_.Irecv(base + at[p] * elem_, bytes(p), p, tag_));
      if (bytes(me) > 0) handles_.push_back(t_.Isend(base + at[me] * elem_, bytes(me), p, tag_));
    }
  }
  void Finish() {
    for (Transport::Handle h : handles_) t_.Wait(h);
  }

 private:
  Transport& t_;
  int tag_;
  size_t elem_;
  std::vector<Transport::Handle> handles_;
};

}  // namespace

void RackOrderedExchange(Transport& all, int nodes_per_rack, void* buffer, int64_t count,
                         DataType dtype, ReduceOp op) {
  const int n = all.size();
  const int me = all.rank();
  if (n == 1 || count == 0) return;
  const size_t elem = DataTypeSize(dtype);
  const size_t bytes = static_cast<size_t>(count) * elem;
  // parts[r]: rank r's buffer (this rank's own is a copy: the sends read
  // `buffer` until they complete); one more part for a rack's partial sum.
  std::vector<char> parts(static_cast<size_t>(n + 1) * bytes);
  auto part = [&](int r) { return parts.data() + static_cast<size_t>(r) * bytes; };
  // Whole elements of at most the transport's largest message each.
  const size_t piece = std::max(elem, all.MaxMessageBytes() / elem * elem);
  std::vector<Transport::Handle> handles;
  for (size_t offset = 0; offset < bytes; offset += piece) {
    const size_t m = std::min(piece, bytes - offset);
    for (int p = 0; p < n; ++p) {
      if (p != me) handles.push_back(all.Irecv(part(p) + offset, m, p, kTagRackExchange));
    }
    for (int p = 0; p < n; ++p) {
      if (p != me) {
        handles.push_back(
            all.Isend(static_cast<const char*>(buffer) + offset, m, p, kTagRackExchange));
      }
    }
  }
  std::memcpy(part(me), buffer, bytes);
  for (Transport::Handle h : handles) all.Wait(h);
  const ReduceOp sum_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  // Rack r's nodes are ranks [r x N, (r + 1) x N): their partial in node
  // order, then folded into the total in rack order.
  char* partial = part(n);
  const int racks = n / nodes_per_rack;
  for (int r = 0; r < racks; ++r) {
    char* into = r == 0 ? static_cast<char*>(buffer) : partial;
    const int first = r * nodes_per_rack;
    std::memcpy(into, part(first), bytes);
    for (int k = 1; k < nodes_per_rack; ++k) ReduceInto(into, part(first + k), count, dtype, sum_op);
    if (r > 0) ReduceInto(buffer, partial, count, dtype, sum_op);
  }
  if (op == ReduceOp::kAverage) DivideBy(buffer, count, dtype, n);
}

size_t RackPieceBytes(size_t call_bytes) {
  return std::clamp<size_t>(call_bytes / 8, kRackPieceBytes, kRackMaxPieceBytes);
}

const char* RackGridAllreduce(const RackGrid& grid, void* buffer, int64_t count, DataType dtype,
                              ReduceOp op, size_t piece_bytes, NetworkChoice choice) {
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  // The size rule's pieces: the caller's (a node's chunk cuts its slice
  // itself), else an eighth of the call.
  const size_t rule_piece = piece_bytes > 0 ? piece_bytes : RackPieceBytes(bytes);
  switch (choice) {
    case NetworkChoice::kRackPipeline256K:
      RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, 256 << 10);
      return "RACK_ALLREDUCE_256K";
    case NetworkChoice::kRackPipeline1M:
      RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, 1 << 20);
      return "RACK_ALLREDUCE_1M";
    case NetworkChoice::kRackPipelineEighth:
      RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, rule_piece);
      return "RACK_ALLREDUCE_EIGHTH";
    default:
      break;
  }
  const bool small = static_cast<size_t>(grid.all->size() - 1) * bytes <= kRackDirectExchangeBytes;
  // Any other choice (kAuto, or one for another step) is the size rule.
  if (choice == NetworkChoice::kRackExchange || small) {
    RackOrderedExchange(*grid.all, grid.rack->size(), buffer, count, dtype, op);
    return "RACK_ORDERED_EXCHANGE";
  }
  RackAllreduce(*grid.rack, *grid.across, buffer, count, dtype, op, rule_piece);
  return "RACK_ALLREDUCE";
}

void RackAllreduce(Transport& rack, Transport& across, void* buffer, int64_t count,
                   DataType dtype, ReduceOp op, size_t piece_bytes) {
  const int nodes = rack.size();
  const int racks = across.size();
  if (count == 0 || nodes * racks == 1) return;
  const size_t elem = DataTypeSize(dtype);
  char* base = static_cast<char*>(buffer);
  // A piece's parts in the rack are its largest messages: at most
  // ceil(piece / nodes) elements, so a piece of nodes x (the largest
  // message) keeps every message within the transport's limit.
  const int64_t max_message = static_cast<int64_t>(
      std::max<size_t>(1, std::min(rack.MaxMessageBytes(), across.MaxMessageBytes()) / elem));
  const int64_t piece = std::max<int64_t>(
      1, std::min<int64_t>(static_cast<int64_t>(piece_bytes / elem), nodes * max_message));
  const int64_t pieces = (count + piece - 1) / piece;
  const int64_t max_segment = (piece + nodes - 1) / nodes;
  const int64_t max_sub = (max_segment + racks - 1) / racks;
  // Sums first; the rank owning a sub-segment after B divides it once.
  const ReduceOp sum_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  const int divisor = op == ReduceOp::kAverage ? nodes * racks : 0;

  // Two of each round, for pieces of even and odd index: a piece's round
  // may still be in flight while the next piece's starts.
  const int me = rack.rank();
  ScatterRound rack_scatter[2] = {{rack, kTagRackScatter, elem, max_segment},
                                  {rack, kTagRackScatter, elem, max_segment}};     // A
  ScatterRound across_scatter[2] = {{across, kTagAcrossScatter, elem, max_sub},
                                    {across, kTagAcrossScatter, elem, max_sub}};  // B
  GatherRound across_gather[2] = {{across, kTagAcrossGather, elem},
                                  {across, kTagAcrossGather, elem}};              // C
  GatherRound rack_gather[2] = {{rack, kTagRackGather, elem}, {rack, kTagRackGather, elem}};  // D
  // Piece p's segments in the rack and sub-segments across racks, from its
  // A (or B) until its D (or C): at most four pieces apart.
  std::vector<int64_t> segments[4], subs[4];
  auto valid = [&](int64_t p) { return p >= 0 && p < pieces; };

  // Step s starts piece s's A, and moves pieces s-1, s-2, s-3 on to B, C,
  // D as soon as their previous round is finished; piece s-4's D finishes.
  // Every wait of step s is for messages the peers posted in step s-1, so
  // no rank can wait on one that is not posted, and each link always has
  // the next piece queued behind the current one: the uplinks stay busy
  // while the rack rounds of other pieces run. pieces + 4 steps drain it.
  for (int64_t s = 0; s < pieces + 4; ++s) {
    if (valid(s)) {
      const int64_t first = s * piece;
      segments[s % 4] = PartStarts(first, std::min(piece, count - first), nodes);
      rack_scatter[s % 2].Start(base, segments[s % 4]);
    }
    if (const int64_t p = s - 1; valid(p)) {
      rack_scatter[p % 2].Finish(dtype, sum_op, 0);
      const std::vector<int64_t>& seg = segments[p % 4];
      subs[p % 4] = PartStarts(seg[me], seg[me + 1] - seg[me], racks);
      across_scatter[p % 2].Start(base, subs[p % 4]);
    }
    if (const int64_t p = s - 2; valid(p)) {
      // The sub-segment this rank owns is final here: divided once.
      across_scatter[p % 2].Finish(dtype, sum_op, divisor);
      across_gather[p % 2].Start(base, subs[p % 4]);
    }
    if (const int64_t p = s - 3; valid(p)) {
      across_gather[p % 2].Finish();
      rack_gather[p % 2].Start(base, segments[p % 4]);
    }
    if (const int64_t p = s - 4; valid(p)) rack_gather[p % 2].Finish();
  }
}

}  // namespace ddl
