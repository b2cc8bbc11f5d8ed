#include "shared_output_allreduce.h"

namespace ddl {

namespace {
// TensorFlow expects a tensor's data to be aligned this much.
constexpr size_t kTensorAlignment = 64;
}  // namespace

bool SharedOutputAllreduce::Run(const std::vector<Span>& spans, DataType dtype, DataType wire,
                                ReduceOp op, std::vector<Output>* outputs,
                                NodePhaseTimes* times) {
  const size_t elem = DataTypeSize(dtype);
  std::vector<size_t> at(spans.size());
  size_t block_bytes = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    at[i] = block_bytes;
    block_bytes = RoundUp(block_bytes + spans[i].count * elem, kTensorAlignment);
  }
  // Local rank 0 allocates; everyone learns the offset (or that there was
  // no room) through its mailbox.
  const uint64_t call = ++calls_;
  if (arena_.rank() == 0) {
    arena_.Post(block_bytes > 0 ? pool_->Allocate(block_bytes, arena_.size())
                                : ShmPool::kNone);
  }
  arena_.Publish(ShmArena::kAnnounced, call);
  arena_.WaitForAll(ShmArena::kAnnounced, call);
  const uint64_t offset = arena_.MailboxOf(0);
  if (offset == ShmPool::kNone) return false;
  // Every rank holds the block once, shared by all its outputs, so that the
  // block goes back to rank 0's pool when the last rank lets go of it. No
  // rank posts its next offset before every rank has read this one: the
  // allreduce below waits for all of them.
  std::shared_ptr<void> hold = pool_->Hold(offset);
  char* const block = pool_->base() + offset;
  const SharedResult into{block, &at};
  node_.Run(spans, dtype, wire, op, times, &into);

  outputs->clear();
  for (size_t i = 0; i < spans.size(); ++i) outputs->push_back({block + at[i], hold});
  return true;
}

}  // namespace ddl
