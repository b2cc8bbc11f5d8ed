#include "mpi_transport.h"

#include <algorithm>
#include <atomic>
#include <climits>

#include "socket_bytes.h"
#include "tags.h"

namespace ddl {

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, length);
}

namespace {
void Check(int code, const char* what) {
  if (code != MPI_SUCCESS) throw TransportError(std::string(what) + ": " + MpiErrorString(code));
}

// Bytes of every message completed by any MpiTransport of this process.
std::atomic<uint64_t> completed_bytes{0};

int CheckedCount(size_t bytes, const char* what) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    throw TransportError(std::string(what) + ": message of " + std::to_string(bytes) +
                         " bytes exceeds the per-message limit");
  }
  return static_cast<int>(bytes);
}
}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  // Errors come back as codes so they become exceptions with context rather
  // than aborting the process from inside a library call. A code that is
  // not MPI_SUCCESS here means MPI cannot describe the communicator: the
  // communicator is freed and the error thrown (the caller owns nothing).
  try {
    Check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    Check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    Check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    MPI_Group group, world_group;
    Check(MPI_Comm_group(comm_, &group), "MPI_Comm_group");
    Check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
    std::vector<int> mine(size_);
    for (int r = 0; r < size_; ++r) mine[r] = r;
    world_ranks_.resize(size_);
    const int translated = MPI_Group_translate_ranks(group, size_, mine.data(), world_group,
                                                     world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    Check(translated, "MPI_Group_translate_ranks");
  } catch (const TransportError&) {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    throw;
  }
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiTransport::AgreeToEnter(const char* what) {
  MPI_Request request;
  Check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  WaitRequest(&request, std::string("every rank before ") + what, 0);
}

std::unique_ptr<Group> MpiTransport::Split(int color, int key) {
  AgreeToEnter("MPI_Comm_split");
  MPI_Comm part = MPI_COMM_NULL;
  Check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &part), "MPI_Comm_split");
  if (part == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiTransport>(part);
}

std::unique_ptr<Group> MpiTransport::SplitByMachine(int key) {
  AgreeToEnter("MPI_Comm_split_type");
  MPI_Comm machine = MPI_COMM_NULL;
  Check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &machine),
        "MPI_Comm_split_type");
  return std::make_unique<MpiTransport>(machine);
}

Transport::Handle MpiTransport::Track(MPI_Request request, int peer, size_t bytes) {
  if (!free_handles_.empty()) {
    Handle h = free_handles_.back();
    free_handles_.pop_back();
    requests_[h] = request;
    peers_[h] = peer;
    bytes_[h] = bytes;
    return h;
  }
  requests_.push_back(request);
  peers_.push_back(peer);
  bytes_.push_back(bytes);
  return static_cast<Handle>(requests_.size() - 1);
}

Transport::Handle MpiTransport::Isend(const void* data, size_t bytes, int peer, int tag) {
  MPI_Request request;
  Check(MPI_Isend(data, CheckedCount(bytes, "send"), MPI_BYTE, peer, tag, comm_, &request),
        "MPI_Isend");
  return Track(request, peer, bytes);
}

Transport::Handle MpiTransport::Irecv(void* data, size_t bytes, int peer, int tag) {
  MPI_Request request;
  Check(MPI_Irecv(data, CheckedCount(bytes, "recv"), MPI_BYTE, peer, tag, comm_, &request),
        "MPI_Irecv");
  return Track(request, peer, bytes);
}

void MpiTransport::Wait(Handle handle) {
  WaitRequest(&requests_[handle], "a message with rank " + std::to_string(world_ranks_[peers_[handle]]),
              bytes_[handle], {peers_[handle]});
  peers_[handle] = -1;
  free_handles_.push_back(handle);
}

bool MpiTransport::Test(Handle handle) {
  int done = 0;
  Check(MPI_Test(&requests_[handle], &done, MPI_STATUS_IGNORE), "MPI_Test");
  if (done) {
    clock_.Progress();
    completed_bytes += bytes_[handle];
    peers_[handle] = -1;
    free_handles_.push_back(handle);
  }
  return done != 0;
}

int64_t MpiTransport::Probe(int peer, int tag) {
  int arrived = 0;
  MPI_Status status;
  Check(MPI_Iprobe(peer, tag, comm_, &arrived, &status), "MPI_Iprobe");
  if (!arrived) return -1;
  int bytes = 0;
  Check(MPI_Get_count(&status, MPI_BYTE, &bytes), "MPI_Get_count");
  return bytes;
}

std::vector<int> MpiTransport::PendingPeers() const {
  std::vector<int> peers;
  for (int p : peers_) {
    if (p >= 0 && std::find(peers.begin(), peers.end(), world_ranks_[p]) == peers.end()) {
      peers.push_back(world_ranks_[p]);
    }
  }
  std::sort(peers.begin(), peers.end());
  return peers;
}

uint64_t MpiTransport::MovedBytes() const {
  return completed_bytes.load() + ProcessConnectionBytes();
}

void MpiTransport::WaitRequest(MPI_Request* request, const std::string& what, size_t bytes,
                               const std::vector<int>& peers, bool idle) {
  // Polling keeps MPI's progress engine moving; the pace (wait.h) spins,
  // yields, then naps; the peer clock runs from this transport's last
  // completed message, and on a timeout the judge hears whom this request
  // waits for (a collective's: every other rank of the group).
  auto done = [&] {
    int complete = 0;
    Check(MPI_Test(request, &complete, MPI_STATUS_IGNORE), what.c_str());
    return complete != 0;
  };
  auto awaited = [&] {
    std::vector<int> world;
    for (int r = 0; r < size_; ++r) {
      const bool named = peers.empty() ? r != rank_ : std::count(peers.begin(), peers.end(), r) > 0;
      if (named) world.push_back(world_ranks_[r]);
    }
    return world;
  };
  WaitFor(done, idle ? IdlePace(spin_polls_) : DataPace(spin_polls_), clock_,
          [&] { return what; }, awaited);
  completed_bytes += bytes;
}

void MpiTransport::WaitOldest(std::vector<Piece>* window, const std::string& what) {
  WaitRequest(&window->front().request, what, window->front().bytes);
  window->erase(window->begin());
}

// The AND runs as recursive doubling over point-to-point messages, not as
// MPI_Iallreduce. MPICH progresses a nonblocking collective's schedule only
// inside MPI_Test, one step per poll that finds the previous step done, and
// on 2 nodes x 2 ranks at 1 Gbit/s a 24-byte MPI_Iallreduce polled every
// 20 us took a median 300-400 us where a blocking one took 40 us; the same
// AND as paired MPI_Isend/MPI_Irecv, polled alike, took about 50 us.
void MpiTransport::AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool idle) {
  if (size_ == 1) return;
  // The ranks past the largest power of two `p` fold in first: rank
  // 2i (i < extra) hands its words to rank 2i+1 and waits for the result,
  // so that p ranks double in log2(p) exchanges. Rank numbering inside the
  // doubling: q = r/2 for the odd folded ranks, r - extra for the rest.
  int p = 1;
  while (p * 2 <= size_) p *= 2;
  const int extra = size_ - p;
  const size_t bytes = words.size() * sizeof(uint64_t);
  // The buffers the messages use live in the transport: a wait that throws
  // (a lost peer) leaves its requests posted, and they must not point into
  // a vector the caller has freed.
  and_send_.assign(words.begin(), words.end());
  and_recv_.resize(words.size());
  auto exchange = [&](int peer, bool send, bool recv) {
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (recv) {
      Check(MPI_Irecv(and_recv_.data(), static_cast<int>(words.size()), MPI_UINT64_T, peer,
                      kTagAgreementAnd, comm_, &requests[0]),
            "MPI_Irecv");
    }
    if (send) {
      Check(MPI_Isend(and_send_.data(), static_cast<int>(words.size()), MPI_UINT64_T, peer,
                      kTagAgreementAnd, comm_, &requests[1]),
            "MPI_Isend");
    }
    // Every other rank stays the awaited set, as for a collective: the
    // judge then looks for a lost rank among all of them, not only this
    // round's partner (who may itself be waiting for the lost one).
    for (MPI_Request& r : requests) {
      if (r != MPI_REQUEST_NULL) WaitRequest(&r, "negotiation allreduce", bytes, {}, idle);
    }
    if (recv) {
      for (size_t i = 0; i < words.size(); ++i) and_send_[i] &= and_recv_[i];
    }
  };
  const bool folded = rank_ < 2 * extra;
  if (folded && rank_ % 2 == 0) {
    exchange(rank_ + 1, true, false);
    exchange(rank_ + 1, false, true);
    words.assign(and_recv_.begin(), and_recv_.end());
    return;
  }
  if (folded) exchange(rank_ - 1, false, true);
  const int q = folded ? rank_ / 2 : rank_ - extra;
  auto actual = [&](int peer_q) { return peer_q < extra ? 2 * peer_q + 1 : peer_q + extra; };
  for (int distance = 1; distance < p; distance *= 2) {
    exchange(actual(q ^ distance), true, true);
  }
  if (folded) exchange(rank_ - 1, true, false);
  words.assign(and_send_.begin(), and_send_.end());
}

std::vector<std::vector<char>> MpiTransport::GatherBytes(const std::vector<char>& mine,
                                                         int root) {
  int my_count = CheckedCount(mine.size(), "gather");
  std::vector<int> counts(rank_ == root ? size_ : 0);
  MPI_Request request;
  Check(MPI_Igather(&my_count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm_, &request),
        "MPI_Igather");
  WaitRequest(&request, "negotiation gather", sizeof(int));
  std::vector<int> displs(counts.size());
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    displs[i] = static_cast<int>(total);
    total += counts[i];
  }
  // The displacements are ints too (the negotiation's names never come
  // near this; a clear error rather than a wrapped offset if they did).
  if (rank_ == root) CheckedCount(static_cast<size_t>(total), "gather");
  std::vector<char> all(static_cast<size_t>(total));
  Check(MPI_Igatherv(mine.data(), my_count, MPI_BYTE, all.data(), counts.data(), displs.data(),
                     MPI_BYTE, root, comm_, &request),
        "MPI_Igatherv");
  WaitRequest(&request, "negotiation gatherv", static_cast<size_t>(total));
  std::vector<std::vector<char>> result(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    result[i].assign(all.begin() + displs[i], all.begin() + displs[i] + counts[i]);
  }
  return result;
}

void MpiTransport::BroadcastBytes(std::vector<char>& data, int root) {
  int64_t count = static_cast<int64_t>(data.size());
  MPI_Request request;
  Check(MPI_Ibcast(&count, 1, MPI_INT64_T, root, comm_, &request), "MPI_Ibcast");
  WaitRequest(&request, "negotiation broadcast", sizeof(int64_t));
  data.resize(static_cast<size_t>(count));
  Broadcast(data.data(), data.size(), root);
}

std::vector<int64_t> MpiTransport::AllgatherInt64(int64_t mine) {
  std::vector<int64_t> all(size_);
  MPI_Request request;
  Check(MPI_Iallgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, comm_, &request),
        "MPI_Iallgather");
  WaitRequest(&request, "allgather of sizes", all.size() * sizeof(int64_t));
  return all;
}

void MpiTransport::Broadcast(void* data, size_t bytes, int root) {
  // A pipeline of pieces, a few in flight: nonblocking collectives on one
  // communicator complete in order, and each completion is progress.
  char* p = static_cast<char*>(data);
  std::vector<Piece> window;
  for (size_t offset = 0; offset < bytes; offset += kMaxMessageBytes) {
    if (window.size() == kPiecesInFlight) WaitOldest(&window, "broadcast");
    const size_t n = std::min(kMaxMessageBytes, bytes - offset);
    window.push_back({MPI_REQUEST_NULL, n});
    Check(MPI_Ibcast(p + offset, static_cast<int>(n), MPI_BYTE, root, comm_,
                     &window.back().request),
          "MPI_Ibcast");
  }
  while (!window.empty()) WaitOldest(&window, "broadcast");
}

void MpiTransport::AllgatherV(const void* mine, size_t my_bytes, void* out,
                              const std::vector<size_t>& bytes_per_rank) {
  // Round k gathers bytes [k*P, (k+1)*P) of every rank's part (P the piece
  // size) into its place in `out`; a part shorter than that sends nothing.
  size_t longest = 0;
  for (size_t b : bytes_per_rank) longest = std::max(longest, b);
  const size_t rounds = (longest + kMaxMessageBytes - 1) / kMaxMessageBytes;
  std::vector<size_t> start(size_, 0);
  for (int r = 1; r < size_; ++r) start[r] = start[r - 1] + bytes_per_rank[r - 1];
  CheckedCount(start.back() + bytes_per_rank.back(), "allgather");
  // Counts and displacements must live until their round completes.
  std::vector<std::vector<int>> counts(rounds, std::vector<int>(size_)),
      displs(rounds, std::vector<int>(size_));
  std::vector<Piece> window;
  char* base = static_cast<char*>(out);
  for (size_t k = 0; k < rounds; ++k) {
    if (window.size() == kPiecesInFlight) WaitOldest(&window, "allgather");
    const size_t from = k * kMaxMessageBytes;
    for (int r = 0; r < size_; ++r) {
      const size_t b = bytes_per_rank[r];
      counts[k][r] = static_cast<int>(b > from ? std::min(kMaxMessageBytes, b - from) : 0);
      displs[k][r] = static_cast<int>(start[r] + std::min(from, b));
    }
    size_t round_bytes = 0;
    for (int c : counts[k]) round_bytes += static_cast<size_t>(c);
    window.push_back({MPI_REQUEST_NULL, round_bytes});
    Check(MPI_Iallgatherv(static_cast<const char*>(mine) + std::min(from, my_bytes),
                          counts[k][rank_], MPI_BYTE, base, counts[k].data(), displs[k].data(),
                          MPI_BYTE, comm_, &window.back().request),
          "MPI_Iallgatherv");
  }
  while (!window.empty()) WaitOldest(&window, "allgather");
}

}  // namespace ddl
