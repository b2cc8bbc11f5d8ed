// One collective as a framework hands it to the core: plain pointers and
// callbacks, no framework types. This is the whole framework-facing surface.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../common/types.h"
#include "../negotiation/message.h"

namespace ddl {

// The agreed part (name, collective, dtypes, op, root, shape, invalid) is
// the CollectiveSpec base (common/types.h).
struct Work : CollectiveSpec {
  const void* input = nullptr;
  // Alltoall: rows of axis 0 this rank sends to each rank (entry r to rank
  // r). Empty asks for an even split; the engine fills it in when it
  // admits the work.
  std::vector<int64_t> splits;
  // Broadcast: preallocated output of the input's shape (may alias the
  // input); allreduce may have one too. Join: an int32 that receives the
  // last rank to join. Allgather and reducescatter: null;
  // the core calls `allocate` with the output shape once it knows it.
  void* output = nullptr;
  // An allreduce with `output` null is allocated through `allocate` unless
  // the core has put the result in memory of its own: then it calls
  // `adopt` with the result and a handle that keeps that memory alive.
  std::function<Status(const std::vector<int64_t>& shape, void** data)> allocate;
  std::function<void(void* data, std::shared_ptr<void> hold)> adopt;
  // Alltoall: told how many rows arrived from each rank, after the engine
  // exchanged the splits and before the data moves (it allocates and fills
  // the received_splits output).
  std::function<Status(const std::vector<int64_t>& rows_from_each)> received_splits;
  // Called exactly once, from the thread running the cycle that ran the
  // work: the engine thread, or an eager op's thread that drove the engine
  // (Engine::EnqueueAndDrive); or from Enqueue on an immediate error.
  std::function<void(const Status&)> done;
  // Set by the engine when the work is enqueued (for the timeline).
  std::chrono::steady_clock::time_point enqueued;
};

// `wire` when it is a conversion the core makes (a float32 allreduce sent
// as float16 or bfloat16), otherwise `dtype`.
inline DataType WireDtype(const Work& w) {
  const bool converts = w.collective == Collective::kAllreduce &&
                        w.dtype == DataType::kFloat32 &&
                        (w.wire == DataType::kFloat16 || w.wire == DataType::kBFloat16);
  return converts ? w.wire : w.dtype;
}

// The request this rank offers for `work`, and the work whose agreed part
// is `request` (no buffers): one function each way, copying the shared
// CollectiveSpec whole.
inline Request RequestOf(const Work& work, int rank) {
  Request r;
  static_cast<CollectiveSpec&>(r) = work;
  r.rank = rank;
  return r;
}
inline Work WorkOf(const Request& request) {
  Work w;
  static_cast<CollectiveSpec&>(w) = request;
  return w;
}

// Calls the done callback once; later calls are no-ops.
inline void Finish(Work& work, const Status& status) {
  auto done = std::move(work.done);
  work.done = nullptr;
  if (done) done(status);
}

}  // namespace ddl
