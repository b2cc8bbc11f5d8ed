// A Group over one MPI communicator: the transport, the small collectives
// the engine's negotiation needs, and the splits into node and process-set
// groups. Only files under transport/ include this header (and mpi.h); the
// engine gets its world from OpenMpiWorld (mpi_world.h). All waiting goes through Wait(), which polls
// with a short spin, then yields, then sleeps with backoff, so ranks that
// outnumber cores still make progress.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

#include "group.h"

namespace ddl {

class MpiTransport : public Group {
 public:
  // Takes ownership of `comm` (freed in the destructor).
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
  // every so often, while a dead peer or a cut link completes none.
  void SetPeerTimeout(double seconds) override { peer_timeout_s_ = seconds; }
  void SetSpinPolls(int polls) override { spin_polls_ = polls; }
  std::vector<int> PendingPeers() const override;

 private:
  // Largest single message of the data path; also the piece size of the
  // pipelined broadcast and allgather. 4 MB take 0.3 s at 100 Mbit/s.
  static constexpr size_t kMaxMessageBytes = size_t(4) << 20;
  static constexpr int kPiecesInFlight = 4;
  void WaitRequest(MPI_Request* request, const std::string& what, bool idle = false);
  // Waits for the oldest of `requests` (a pipeline's window) and drops it.
  void WaitOldest(std::vector<MPI_Request>* requests, const std::string& what);
  Handle Track(MPI_Request request, int peer);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  double peer_timeout_s_ = 0;
  int spin_polls_ = 50;
  // When a message of this transport last completed, or a wait began
  // after half a timeout without one: the clock of the peer timeout.
  std::chrono::steady_clock::time_point last_progress_;
  std::vector<MPI_Request> requests_;
  std::vector<int> peers_;  // peer of each in-flight handle
  std::vector<Handle> free_handles_;
};

// Wraps an MPI error code into a readable message.
std::string MpiErrorString(int code);

}  // namespace ddl
