// Allreduce on one node whose result lands, once, in memory that every
// local rank's outputs view: a block of node shared memory (ShmPool) that
// local rank 0 allocates for the fused batch and every rank holds until its
// tensors are gone. The chunks run through NodeAllreduce's cache-sized
// slots as usual, but the owner of each slice writes it straight into the
// block, so no rank copies results out: per rank, the memory traffic is
// reading its input and writing 1/n of the result, instead of reading its
// input and writing all of it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "../common/types.h"
#include "../transport/shm_arena.h"
#include "../transport/shm_pool.h"
#include "node_allreduce.h"
#include "span_walker.h"

namespace ddl {

class SharedOutputAllreduce {
 public:
  SharedOutputAllreduce(ShmArena& arena, std::shared_ptr<ShmPool> pool, NodeAllreduce& node)
      : arena_(arena), pool_(std::move(pool)), node_(node) {}

  // One tensor's result: where it lies, and this rank's handle on the
  // block; the block (and the pool's mapping) lives while a copy exists.
  struct Output {
    void* data;
    std::shared_ptr<void> hold;
  };

  // Reads spans[i].in, ignores spans[i].out; fills *outputs. Returns false,
  // on every local rank alike, when the pool had no room; nothing was
  // reduced then and the caller runs NodeAllreduce into its own outputs.
  bool Run(const std::vector<Span>& spans, DataType dtype, DataType wire, ReduceOp op,
           std::vector<Output>* outputs, NodePhaseTimes* times);

 private:
  ShmArena& arena_;
  std::shared_ptr<ShmPool> pool_;
  NodeAllreduce& node_;
  uint64_t calls_ = 0;  // same on every local rank: they run the same calls
};

}  // namespace ddl
