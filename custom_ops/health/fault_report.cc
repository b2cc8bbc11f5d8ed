#include "fault_report.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "../common/job_secret.h"
#include "../common/util.h"
#include "../transport/probe_responder.h"
#include "../transport/probe_socket.h"
#include "../transport/transport.h"
#include "liveness.h"

namespace ddl {

namespace {

// What this process's responder answers a caller with the job's secret:
// the answer byte, then what its ranks are doing (one line per rank and
// process set; liveness.h, encoded by probe_wire.h).
std::string OwnAnswer() { return ActivityBoard::Get().Describe(); }

ProbeResponder& Responder() { return ProbeResponder::Start(OwnAnswer); }

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
  size_t process = 0;  // index into the list of processes probed
  bool connected = false;
  std::string answer;  // what the responder sent so far
};

// One process to probe: every peer rank it holds shares the outcome.
struct Process {
  std::vector<size_t> peers;  // indices into the survey
  PeerState state = PeerState::kUnreachable;
  std::string answer;         // the best probe's answer (for the activity lines)
};

// Reads the activity lines of an answer into the survey entries of the
// process's ranks, for process set `set` (lines of other sets skipped).
// An answer that does not decode tells nothing of what its ranks do: its
// process answered (alive), with nothing known of its engines.
void ReadActivity(const std::string& bytes, int set, std::vector<PeerView>* views,
                  const std::vector<size_t>& peers) {
  ProbeAnswer answer;
  if (!DecodeProbeAnswer(bytes, &answer).ok()) return;
  for (size_t i : peers) (*views)[i].ending = (*views)[i].ending || answer.ending;
  for (const ActivityLine& line : answer.lines) {
    if (line.set != set) continue;
    for (size_t i : peers) {
      PeerView& v = (*views)[i];
      if (v.world_rank != line.world_rank) continue;
      v.known = true;
      v.step = line.step;
      v.inside = line.inside;
      v.moved = line.moved;
    }
  }
}

}  // namespace

PeerTable PeerTable::Exchange(ControlPlane& group, const std::string& job_secret) {
  PeerIdentity mine;
  mine.world_rank = group.WorldRank(group.rank());
  mine.host = HostName();
  mine.pid = static_cast<int>(getpid());
  mine.port = Responder().port();
  mine.addresses = Responder().addresses();
  const std::string encoded = EncodeIdentity(mine);
  std::vector<std::vector<char>> gathered =
      group.GatherBytes(std::vector<char>(encoded.begin(), encoded.end()), 0);
  // Root sends the group's secret (DDL_JOB_SECRET's, else drawn now: a
  // process set gets one of its own), then every identity.
  std::string secret;
  if (group.rank() == 0 && !ParseJobSecret(job_secret, &secret).ok()) secret = DrawJobSecret();
  std::vector<char> all = EncodeIdentities(secret, gathered);
  group.BroadcastBytes(all, 0);
  PeerTable table;
  table.me_ = group.rank();
  std::vector<std::string> identities;
  Status s = SplitIdentities(all, static_cast<size_t>(group.size()), &table.secret_, &identities);
  for (int r = 0; s.ok() && r < group.size(); ++r) {
    table.peers_.emplace_back();
    s = DecodeIdentity(identities[r], group.WorldRank(r), &table.peers_.back());
  }
  if (!s.ok()) throw TransportError(s.message() + OnRank(mine.world_rank));
  Responder().Admit(table.secret_);
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
  std::vector<std::pair<int, PeerState>> states;
  for (const PeerView& v : Survey(patience_s, 0)) states.emplace_back(v.world_rank, v.state);
  return states;
}

std::vector<PeerView> PeerTable::Survey(double patience_s, int set) const {
  const PeerIdentity& me = Me();
  std::vector<PeerView> views;
  std::vector<Process> processes;
  std::vector<Probe> probes;
  // Ranks of one process (threads as ranks in tests) are probed once.
  std::vector<std::string> keys;
  for (const PeerIdentity& p : peers_) {
    if (p.world_rank == me.world_rank) continue;
    views.push_back({});
    views.back().world_rank = p.world_rank;
    const std::string key = p.host + "\n" + std::to_string(p.pid) + "\n" + std::to_string(p.port);
    const size_t at = std::find(keys.begin(), keys.end(), key) - keys.begin();
    if (at < keys.size()) {
      processes[at].peers.push_back(views.size() - 1);
      continue;
    }
    keys.push_back(key);
    processes.push_back({});
    processes.back().peers.push_back(views.size() - 1);
    Process& process = processes.back();
    if (p.host == me.host && p.pid == me.pid) {
      // Ranks of this very process (threads as ranks; process sets): alive,
      // and its board is what its responder would answer. Read directly,
      // so hundreds of thread-ranks judging at once do not queue on the
      // one responder thread and time out as "stopped".
      process.state = PeerState::kAlive;
      process.answer = ActivityBoard::Get().Describe();
      continue;
    }
    std::vector<std::string> addresses;
    if (p.host == me.host) {
      const PeerState seen = StateFromProc(p.pid);
      if (seen != PeerState::kAlive) {
        process.state = seen;
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
        probes.push_back({fd, processes.size() - 1, false, {}});
      } else if (refused && process.state == PeerState::kUnreachable) {
        process.state = PeerState::kGone;
      }
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(patience_s);
  auto settle = [&](Probe& probe, PeerState state) {
    Process& process = processes[probe.process];
    if (Rank(state) > Rank(process.state)) {
      process.state = state;
      process.answer = probe.answer;
    }
    CloseSocket(probe.fd);
    probe.fd = -1;
  };
  for (;;) {
    std::vector<SocketWait> waiting;
    std::vector<Probe*> owners;
    for (Probe& probe : probes) {
      if (probe.fd < 0) continue;
      waiting.push_back({probe.fd, !probe.connected, false});
      owners.push_back(&probe);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    if (waiting.empty() || left <= 0) break;
    if (!WaitForSockets(&waiting, static_cast<int>(left))) break;
    for (size_t i = 0; i < waiting.size(); ++i) {
      Probe& probe = *owners[i];
      if (!waiting[i].ready) continue;
      if (!probe.connected) {
        const int error = ConnectError(probe.fd);
        if (error == 0) {
          // The peer's kernel accepted: now the secret (16 bytes always fit
          // an empty socket's buffer), then wait for the process.
          probe.connected = true;
          if (!SendAll(probe.fd, secret_)) {
            settle(probe, PeerState::kUnreachable);
          }
        } else {
          settle(probe, IsRefusal(error) ? PeerState::kGone : PeerState::kUnreachable);
        }
        continue;
      }
      // The answer byte, then activity lines, until the responder closes.
      const ReadOutcome read = ReadSome(probe.fd, &probe.answer);
      // An answer longer than any the encoder makes is not read on: its
      // first byte already says alive, its lines will not decode.
      if (read != ReadOutcome::kClosed && probe.answer.size() <= kMaxProbeAnswerBytes) continue;
      settle(probe, !probe.answer.empty() && probe.answer[0] == kProbeAnswerByte ? PeerState::kAlive
                                                                         : PeerState::kGone);
    }
  }
  // Accepted by the host, never answered by the process: stopped or frozen
  // (an answer cut short still says the process is there).
  for (Probe& probe : probes) {
    if (probe.fd < 0) continue;
    settle(probe, !probe.answer.empty() && probe.answer[0] == kProbeAnswerByte ? PeerState::kAlive
                  : probe.connected                                    ? PeerState::kStopped
                                                                       : PeerState::kUnreachable);
  }
  for (const Process& process : processes) {
    for (size_t i : process.peers) views[i].state = process.state;
    if (process.state == PeerState::kAlive) ReadActivity(process.answer, set, &views, process.peers);
  }
  return views;
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
  return DescribeFault(table, phase, what, awaited, table.ProbeAll(patience_s));
}

std::string DescribeFault(const PeerTable& table, const std::string& phase,
                          const std::string& what, const std::vector<int>& awaited,
                          const std::vector<std::pair<int, PeerState>>& states) {
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
