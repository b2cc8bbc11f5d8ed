// A group of ranks as the engine sees it: a Transport (point-to-point
// data) and a ControlPlane (small group operations) over the same ranks,
// plus the group-wide data collectives a transport may run natively, and
// the splits that make node, cross-node and process-set groups. The engine
// holds only Groups; MpiTransport implements one over a communicator, and
// tests/core/in_process.h with threads as ranks.
#pragma once

#include <memory>
#include <vector>

#include "control_plane.h"
#include "transport.h"
#include "wait.h"

namespace ddl {

class Group : public Transport, public ControlPlane {
 public:
  // One rank and size for both faces.
  int rank() const override = 0;
  int size() const override = 0;

  // Collective over this group: the ranks passing the same `color` form a
  // new group, ordered by `key` (ties by rank here). A negative color takes
  // part without joining any group and gets null.
  virtual std::unique_ptr<Group> Split(int color, int key) = 0;
  // Collective: the ranks of this group that share memory on one machine,
  // ordered by `key`.
  virtual std::unique_ptr<Group> SplitByMachine(int key) = 0;

  // Every rank ends with root's `bytes` bytes at `data`.
  virtual void Broadcast(void* data, size_t bytes, int root) = 0;
  // Rank r's `bytes_per_rank[r]` bytes land in `out` after those of ranks
  // below r; `mine` holds this rank's part.
  virtual void AllgatherV(const void* mine, size_t my_bytes, void* out,
                          const std::vector<size_t>& bytes_per_rank) = 0;

  // Once no message of this group has completed for this long (0 = wait
  // forever), a wait asks the judge set by SetLiveness, if any, and throws
  // PeerTimeout unless it says the transfer is moving (transport/wait.h).
  // Progress, not elapsed time.
  virtual void SetPeerTimeout(double seconds) = 0;
  // Not owned; must outlive the group's waits (null: the timeout decides).
  virtual void SetLiveness(Liveness* judge) = 0;
  // Bytes this rank's transport has moved so far, as far as it can see:
  // completed messages, and where it can read them, the bytes its
  // connections carried (so a long message shows progress before it
  // completes). Only its growth means anything; any thread may call it.
  virtual uint64_t MovedBytes() const = 0;
  // Polls a wait makes before it starts yielding its core (DDL_SPIN_POLLS).
  virtual void SetSpinPolls(int polls) = 0;
  // World ranks of the peers of messages still in flight (for errors).
  virtual std::vector<int> PendingPeers() const = 0;
};

}  // namespace ddl
