#include "fault_report.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "../common/util.h"
#include "../transport/transport.h"

namespace ddl {

namespace {

constexpr char kAnswer = 'K';

// Answers every probe with one byte, from a thread of its own, for the
// life of the process (never stopped: a process ends with it). Blocking
// accept: it costs nothing while nobody probes.
class Responder {
 public:
  static const Responder& Get() {
    static const Responder* responder = new Responder();  // lives until the process ends
    return *responder;
  }
  int port() const { return port_; }

 private:
  Responder() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t length = sizeof(any);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&any), sizeof(any)) != 0 || listen(fd_, 128) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&any), &length) != 0) {
      close(fd_);
      fd_ = -1;
      return;  // no responder: the other ranks call this one unreachable
    }
    port_ = ntohs(any.sin_port);
    std::thread(&Responder::Serve, fd_).detach();
  }

  static void Serve(int listener) {
    for (;;) {
      const int client = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        // Out of descriptors, say: try again later rather than spin.
        if (errno != EINTR && errno != ECONNABORTED) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        continue;
      }
      (void)send(client, &kAnswer, 1, MSG_NOSIGNAL);
      close(client);
    }
  }

  int fd_ = -1;
  int port_ = 0;
};

std::vector<std::string> OwnAddresses() {
  std::vector<std::string> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) found.push_back(text);
  }
  freeifaddrs(list);
  return found;
}

std::string Encode(const PeerIdentity& p) {
  std::string addresses;
  for (const std::string& a : p.addresses) addresses += (addresses.empty() ? "" : ",") + a;
  return p.host + "\n" + std::to_string(p.pid) + "\n" + std::to_string(p.port) + "\n" + addresses;
}

PeerIdentity Decode(const std::string& text, int world_rank) {
  PeerIdentity p;
  p.world_rank = world_rank;
  std::istringstream in(text);
  std::string pid, port, addresses;
  std::getline(in, p.host);
  std::getline(in, pid);
  std::getline(in, port);
  std::getline(in, addresses);
  p.pid = std::atoi(pid.c_str());
  p.port = std::atoi(port.c_str());
  std::istringstream list(addresses);
  for (std::string a; std::getline(list, a, ',');) {
    if (!a.empty()) p.addresses.push_back(a);
  }
  return p;
}

// What /proc says of a process on this host: gone, stopped, or (alive)
// running or sleeping, which a probe then confirms.
PeerState StateFromProc(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line)) return PeerState::kGone;
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return PeerState::kAlive;
  const char state = line[close + 2];
  if (state == 'Z' || state == 'X') return PeerState::kGone;
  if (state == 'T' || state == 't') return PeerState::kStopped;
  return PeerState::kAlive;
}

// The better-informed of two probe outcomes of one peer (over several of
// its addresses): an answer beats an accept, which beats a refusal, which
// beats silence.
int Rank(PeerState s) {
  switch (s) {
    case PeerState::kAlive: return 3;
    case PeerState::kStopped: return 2;
    case PeerState::kGone: return 1;
    case PeerState::kUnreachable: return 0;
  }
  return 0;
}

struct Probe {
  int fd = -1;
  size_t peer = 0;  // index into the outcome list
  bool connected = false;
};

// Starts a connection to address:port; -1 if it failed at once (then
// `refused` says whether the host said no).
int StartConnect(const std::string& address, int port, bool* refused) {
  *refused = false;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &to.sin_addr) != 1) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 || errno == EINPROGRESS) {
    return fd;
  }
  *refused = errno == ECONNREFUSED;
  close(fd);
  return -1;
}

}  // namespace

PeerTable PeerTable::Exchange(ControlPlane& group) {
  PeerIdentity mine;
  mine.world_rank = group.WorldRank(group.rank());
  mine.host = HostName();
  mine.pid = static_cast<int>(getpid());
  mine.port = Responder::Get().port();
  mine.addresses = OwnAddresses();
  const std::string encoded = Encode(mine);
  std::vector<std::vector<char>> gathered =
      group.GatherBytes(std::vector<char>(encoded.begin(), encoded.end()), 0);
  // Root sends every identity, each after its length as 8 decimal digits.
  std::vector<char> all;
  for (const auto& bytes : gathered) {
    char length[9];
    std::snprintf(length, sizeof(length), "%08zu", bytes.size());
    all.insert(all.end(), length, length + 8);
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  group.BroadcastBytes(all, 0);
  PeerTable table;
  table.me_ = group.rank();
  size_t at = 0;
  for (int r = 0; r < group.size() && at + 8 <= all.size(); ++r) {
    const size_t length = std::strtoul(std::string(&all[at], 8).c_str(), nullptr, 10);
    at += 8;
    table.peers_.push_back(Decode(std::string(&all[at], std::min(length, all.size() - at)),
                                  group.WorldRank(r)));
    at += length;
  }
  return table;
}

const PeerIdentity* PeerTable::Find(int world_rank) const {
  for (const PeerIdentity& p : peers_) {
    if (p.world_rank == world_rank) return &p;
  }
  return nullptr;
}

std::string PeerTable::Name(int world_rank) const {
  const PeerIdentity* p = Find(world_rank);
  return "rank " + std::to_string(world_rank) + (p ? " on " + p->host : "");
}

std::vector<std::pair<int, PeerState>> PeerTable::ProbeAll(double patience_s) const {
  const PeerIdentity& me = Me();
  std::vector<std::pair<int, PeerState>> outcome;
  std::vector<Probe> probes;
  for (const PeerIdentity& p : peers_) {
    if (p.world_rank == me.world_rank) continue;
    const size_t index = outcome.size();
    outcome.emplace_back(p.world_rank, PeerState::kUnreachable);
    std::vector<std::string> addresses;
    if (p.host == me.host) {
      const PeerState seen = StateFromProc(p.pid);
      if (seen != PeerState::kAlive) {
        outcome[index].second = seen;
        continue;
      }
      addresses = {"127.0.0.1"};
    } else {
      // An address this host has too (a container bridge, say) would
      // reach this host, not the peer's.
      for (const std::string& a : p.addresses) {
        if (std::find(me.addresses.begin(), me.addresses.end(), a) == me.addresses.end()) {
          addresses.push_back(a);
        }
      }
    }
    if (p.port == 0) continue;
    for (const std::string& a : addresses) {
      bool refused = false;
      const int fd = StartConnect(a, p.port, &refused);
      if (fd >= 0) {
        probes.push_back({fd, index, false});
      } else if (refused && outcome[index].second == PeerState::kUnreachable) {
        outcome[index].second = PeerState::kGone;
      }
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(patience_s);
  auto settle = [&](Probe& probe, PeerState state) {
    PeerState& best = outcome[probe.peer].second;
    if (Rank(state) > Rank(best)) best = state;
    close(probe.fd);
    probe.fd = -1;
  };
  for (;;) {
    std::vector<pollfd> waiting;
    std::vector<Probe*> owners;
    for (Probe& probe : probes) {
      if (probe.fd < 0) continue;
      waiting.push_back({probe.fd, static_cast<short>(probe.connected ? POLLIN : POLLOUT), 0});
      owners.push_back(&probe);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    if (waiting.empty() || left <= 0) break;
    if (poll(waiting.data(), waiting.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < waiting.size(); ++i) {
      Probe& probe = *owners[i];
      if (waiting[i].revents == 0) continue;
      if (!probe.connected) {
        int error = 0;
        socklen_t length = sizeof(error);
        getsockopt(probe.fd, SOL_SOCKET, SO_ERROR, &error, &length);
        if (error == 0) {
          probe.connected = true;  // the peer's kernel accepted: now wait for the process
        } else {
          settle(probe, error == ECONNREFUSED ? PeerState::kGone : PeerState::kUnreachable);
        }
        continue;
      }
      char answer = 0;
      const ssize_t got = recv(probe.fd, &answer, 1, 0);
      settle(probe, got == 1 && answer == kAnswer ? PeerState::kAlive : PeerState::kGone);
    }
  }
  // Accepted by the host, never answered by the process: stopped or frozen.
  for (Probe& probe : probes) {
    if (probe.fd >= 0) settle(probe, probe.connected ? PeerState::kStopped : PeerState::kUnreachable);
  }
  return outcome;
}

namespace {

const char* Explain(PeerState s) {
  switch (s) {
    case PeerState::kGone: return "gone: the process died or was killed";
    case PeerState::kStopped:
      return "stopped: the process exists but does not answer (SIGSTOP, a debugger, or frozen)";
    case PeerState::kUnreachable: return "unreachable: dead, stopped, or the network to it is down";
    case PeerState::kAlive: return "alive";
  }
  return "";
}

}  // namespace

std::string DescribeFault(const PeerTable& table, const std::string& phase,
                          const std::string& what, const std::vector<int>& awaited,
                          double patience_s) {
  const auto states = table.ProbeAll(patience_s);
  std::vector<int> lost, stuck;
  std::string details;
  for (const auto& [rank, state] : states) {
    if (state == PeerState::kAlive) {
      if (std::find(awaited.begin(), awaited.end(), rank) != awaited.end()) stuck.push_back(rank);
      continue;
    }
    lost.push_back(rank);
    details += (details.empty() ? "" : "; ") + table.Name(rank) + " " + Explain(state);
  }
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  char when[64];
  std::snprintf(when, sizeof(when), "%.3f", std::chrono::duration<double>(now).count());
  // The wall-clock time, since this line may reach the launcher late
  // (over the very link that failed).
  std::string text = std::string("at unix time ") + when + ": " +
                     table.Name(table.Me().world_rank) + " lost contact in " + phase + " (" +
                     what + "). ";
  if (!lost.empty()) {
    text += "Unreachable: rank(s) [" + RankList(lost) + "]: " + details + ". ";
  } else {
    text += "Every other rank answers a probe: none died or was cut off, so a collective hangs. ";
  }
  if (!stuck.empty()) {
    text += "Rank(s) [" + RankList(stuck) +
            "] answer but made no progress: each waits for another rank, or hangs. ";
  }
  return text;
}

}  // namespace ddl
