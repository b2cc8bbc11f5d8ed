#include "mpi_transport.h"

#include <sched.h>

#include <chrono>
#include <climits>
#include <thread>

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
  // than aborting the process from inside a library call.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Group group, world_group;
  MPI_Comm_group(comm_, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> mine(size_);
  for (int r = 0; r < size_; ++r) mine[r] = r;
  world_ranks_.resize(size_);
  MPI_Group_translate_ranks(group, size_, mine.data(), world_group, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Transport::Handle MpiTransport::Track(MPI_Request request, int peer) {
  if (!free_handles_.empty()) {
    Handle h = free_handles_.back();
    free_handles_.pop_back();
    requests_[h] = request;
    peers_[h] = peer;
    return h;
  }
  requests_.push_back(request);
  peers_.push_back(peer);
  return static_cast<Handle>(requests_.size() - 1);
}

Transport::Handle MpiTransport::Isend(const void* data, size_t bytes, int peer, int tag) {
  MPI_Request request;
  Check(MPI_Isend(data, CheckedCount(bytes, "send"), MPI_BYTE, peer, tag, comm_, &request),
        "MPI_Isend");
  return Track(request, peer);
}

Transport::Handle MpiTransport::Irecv(void* data, size_t bytes, int peer, int tag) {
  MPI_Request request;
  Check(MPI_Irecv(data, CheckedCount(bytes, "recv"), MPI_BYTE, peer, tag, comm_, &request),
        "MPI_Irecv");
  return Track(request, peer);
}

void MpiTransport::Wait(Handle handle) {
  WaitRequest(&requests_[handle], "a message with rank " + std::to_string(world_ranks_[peers_[handle]]));
  free_handles_.push_back(handle);
}

bool MpiTransport::Test(Handle handle) {
  int done = 0;
  Check(MPI_Test(&requests_[handle], &done, MPI_STATUS_IGNORE), "MPI_Test");
  if (done) free_handles_.push_back(handle);
  return done != 0;
}

void MpiTransport::WaitRequest(MPI_Request* request, const std::string& what, bool idle) {
  // Polling keeps the progress engine moving; the spin covers the common
  // case where the peer is already there. After that we yield (another rank
  // may share this core) and finally sleep, doubling up to 1 ms, so an idle
  // rank costs almost nothing while it waits for a slow one.
  const int kSpinPolls = idle ? 10 : 2000;
  const int kYieldPolls = idle ? 10 : 2000;
  // An idle wait must still poll often: a peer that arrives later needs our
  // MPI_Test calls to progress the collective it is waiting on.
  auto sleep_for = std::chrono::microseconds(20);
  const auto kMaxSleep = std::chrono::microseconds(idle ? 200 : 1000);
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), what.c_str());
    if (done) return;
    if (peer_timeout_s_ > 0 && (polls & 63) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            peer_timeout_s_) {
      throw PeerTimeout("no progress for " + std::to_string(static_cast<int>(peer_timeout_s_)) +
                        " s waiting for " + what);
    }
    if (polls < kSpinPolls) continue;
    if (polls < kSpinPolls + kYieldPolls) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(sleep_for);
    if (sleep_for < kMaxSleep) sleep_for *= 2;
  }
}

void MpiTransport::AllreduceBitwiseAnd(std::vector<uint64_t>& words, bool idle) {
  MPI_Request request;
  Check(MPI_Iallreduce(MPI_IN_PLACE, words.data(), static_cast<int>(words.size()),
                       MPI_UINT64_T, MPI_BAND, comm_, &request),
        "MPI_Iallreduce");
  WaitRequest(&request, "negotiation allreduce", idle);
}

std::vector<std::vector<char>> MpiTransport::GatherBytes(const std::vector<char>& mine,
                                                         int root) {
  int my_count = CheckedCount(mine.size(), "gather");
  std::vector<int> counts(rank_ == root ? size_ : 0);
  MPI_Request request;
  Check(MPI_Igather(&my_count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm_, &request),
        "MPI_Igather");
  WaitRequest(&request, "negotiation gather");
  std::vector<int> displs(counts.size());
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    displs[i] = static_cast<int>(total);
    total += counts[i];
  }
  std::vector<char> all(static_cast<size_t>(total));
  Check(MPI_Igatherv(mine.data(), my_count, MPI_BYTE, all.data(), counts.data(), displs.data(),
                     MPI_BYTE, root, comm_, &request),
        "MPI_Igatherv");
  WaitRequest(&request, "negotiation gatherv");
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
  WaitRequest(&request, "negotiation broadcast");
  data.resize(static_cast<size_t>(count));
  Broadcast(data.data(), data.size(), root);
}

std::vector<int64_t> MpiTransport::AllgatherInt64(int64_t mine) {
  std::vector<int64_t> all(size_);
  MPI_Request request;
  Check(MPI_Iallgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, comm_, &request),
        "MPI_Iallgather");
  WaitRequest(&request, "allgather of sizes");
  return all;
}

void MpiTransport::Broadcast(void* data, size_t bytes, int root) {
  // Chunked so a buffer above the int count limit still goes through.
  char* p = static_cast<char*>(data);
  for (size_t offset = 0; offset < bytes || offset == 0; offset += kMaxMessageBytes) {
    size_t n = std::min(kMaxMessageBytes, bytes - offset);
    MPI_Request request;
    Check(MPI_Ibcast(p + offset, static_cast<int>(n), MPI_BYTE, root, comm_, &request),
          "MPI_Ibcast");
    WaitRequest(&request, "broadcast");
    if (bytes == 0) break;
  }
}

void MpiTransport::AllgatherV(const void* mine, size_t my_bytes, void* out,
                              const std::vector<size_t>& bytes_per_rank) {
  std::vector<int> counts(size_), displs(size_);
  size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = CheckedCount(bytes_per_rank[r], "allgather");
    displs[r] = CheckedCount(offset, "allgather");
    offset += bytes_per_rank[r];
  }
  MPI_Request request;
  Check(MPI_Iallgatherv(mine, CheckedCount(my_bytes, "allgather"), MPI_BYTE, out, counts.data(),
                        displs.data(), MPI_BYTE, comm_, &request),
        "MPI_Iallgatherv");
  WaitRequest(&request, "allgather");
}

}  // namespace ddl
