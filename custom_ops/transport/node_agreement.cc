#include "node_agreement.h"

#include <chrono>
#include <cstring>

namespace ddl {

NodeAgreement::NodeAgreement(ControlPlane& inner, ControlPlane& node,
                             const std::string& name_token, size_t max_words)
    : inner_(inner), max_words_(max_words) {
  // The caller guarantees that `node` and `inner` are the same ranks in
  // the same order (Context: one node, split by world rank).
  arena_ = ShmArena::Create(node, name_token, max_words * sizeof(uint64_t), 2);
}

void NodeAgreement::AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool idle) {
  if (words.size() > max_words_ || size() == 1) {
    if (size() > 1) inner_.AllreduceBitwiseAnd(words, idle);
    return;
  }
  const uint64_t round = ++round_;
  const int parity = static_cast<int>(round & 1);
  const size_t bytes = words.size() * sizeof(uint64_t);
  std::memcpy(arena_->Slot(arena_->rank(), parity), words.data(), bytes);
  // The release of the counter publishes the slot's words with it.
  arena_->Publish(ShmArena::kPosted, round);
  // An idle round waits at the pace that favours the core, like the MPI
  // round it replaces; a round with work spins at shared memory's pace,
  // but naps at most 100 us as that round did: in a chain of ops the other
  // rank often arrives a few hundred microseconds late, and a nap of up to
  // 1 ms would add the rest of itself to the call.
  WaitPace busy = SharedMemoryPace();
  busy.max_nap = std::chrono::microseconds(100);
  arena_->WaitForAll(ShmArena::kPosted, round, idle ? IdlePace(10) : busy);
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    const uint64_t* theirs = reinterpret_cast<const uint64_t*>(arena_->Slot(r, parity));
    for (size_t i = 0; i < words.size(); ++i) words[i] &= theirs[i];
  }
}

}  // namespace ddl
