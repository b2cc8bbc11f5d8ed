// A Group over one MPI communicator: the transport, the small collectives
// the engine's negotiation needs, and the splits into node and process-set
// groups. Only files under transport/ include this header (and mpi.h); the
// engine gets its world from OpenMpiWorld (mpi_world.h). All waiting goes
// through WaitRequest, which polls at the pace and with the peer clock of
// transport/wait.h, so ranks that outnumber cores still make progress and
// a slow but moving transfer is told from a dead peer.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "group.h"

namespace ddl {

class MpiTransport : public Group {
 public:
  // Takes ownership of `comm` (freed in the destructor). Throws
  // TransportError if MPI refuses to describe it.
  explicit MpiTransport(MPI_Comm comm);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Handle Isend(const void* data, size_t bytes, int peer, int tag) override;
  Handle Irecv(void* data, size_t bytes, int peer, int tag) override;
  void Wait(Handle handle) override;
  bool Test(Handle handle) override;
  int64_t Probe(int peer, int tag) override;
  size_t MaxMessageBytes() const override { return kMaxMessageBytes; }

  // ControlPlane. An idle AND waits by sleeping rather than spinning, so
  // an idle engine costs almost no CPU.
  void AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool idle) override;
  std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine, int root) override;
  void BroadcastBytes(std::vector<char>& data, int root) override;
  std::vector<int64_t> AllgatherInt64(int64_t mine) override;
  // Group. The data collectives move large buffers as a pipeline of
  // bounded pieces (kMaxMessageBytes, kPiecesInFlight at a time), so a slow
  // link shows progress piece by piece.
  std::unique_ptr<Group> Split(int color, int key) override;
  std::unique_ptr<Group> SplitByMachine(int key) override;
  void Broadcast(void* data, size_t bytes, int root) override;
  void AllgatherV(const void* mine, size_t my_bytes, void* out,
                  const std::vector<size_t>& bytes_per_rank) override;

  MPI_Comm comm() const { return comm_; }
  // Rank in MPI_COMM_WORLD of this communicator's rank `r`.
  int WorldRank(int r) const override { return world_ranks_[r]; }

  // Every data path moves bounded pieces, so a slow link completes one
  // every so often, while a dead peer or a cut link completes none; a
  // piece that takes longer than the timeout goes to the judge.
  void SetPeerTimeout(double seconds) override { clock_.SetTimeout(seconds); }
  double PeerTimeoutSeconds() const override { return clock_.timeout_s(); }
  void SetLiveness(Liveness* judge) override { clock_.SetLiveness(judge); }
  void SetSpinPolls(int polls) override { spin_polls_ = polls; }
  std::vector<int> PendingPeers() const override;
  // The bytes of every completed message of any MpiTransport of this
  // process, plus what its TCP connections carried (socket_bytes.h).
  uint64_t MovedBytes() const override;

 private:
  // Largest single message of the data path; also the piece size of the
  // pipelined broadcast and allgather. 4 MB take 0.3 s at 100 Mbit/s.
  static constexpr size_t kMaxMessageBytes = size_t(4) << 20;
  static constexpr int kPiecesInFlight = 4;
  // Waits for `request`, which moves `bytes` (for MovedBytes); `peers`:
  // the group ranks it waits for (empty: every other rank, a collective).
  void WaitRequest(MPI_Request* request, const std::string& what, size_t bytes,
                   const std::vector<int>& peers = {}, bool idle = false);
  // A pipeline's request in flight and the bytes it gathers or sends.
  struct Piece {
    MPI_Request request;
    size_t bytes;
  };
  // Waits for the oldest piece of a pipeline's window and drops it.
  void WaitOldest(std::vector<Piece>* window, const std::string& what);
  Handle Track(MPI_Request request, int peer, size_t bytes);
  // Before a blocking call that every rank must enter (MPI_Comm_split):
  // a barrier with the peer timeout, so that a rank that never comes ends
  // the others' wait instead of leaving them in MPI forever.
  void AgreeToEnter(const char* what);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  int spin_polls_ = 50;
  // Runs from the last completed message of this transport (or from the
  // start of a wait after half a timeout without one).
  PeerClock clock_;
  std::vector<MPI_Request> requests_;
  std::vector<int> peers_;  // peer of each in-flight handle
  std::vector<size_t> bytes_;  // bytes of each in-flight handle
  std::vector<Handle> free_handles_;
  // AllreduceBitwiseAnd's words in flight: this rank's running AND and the
  // partner's words of the current exchange (kept across calls).
  std::vector<uint64_t> and_send_, and_recv_;
};

// Wraps an MPI error code into a readable message.
std::string MpiErrorString(int code);

}  // namespace ddl
