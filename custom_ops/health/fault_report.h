// One diagnosis for every fault, whatever the phase it hits.
//
// When a collective makes no progress within DDL_PEER_TIMEOUT_S, or the
// transport fails, the rank cannot tell from the collective alone whether
// a peer died, was stopped, or sits behind a cut link: all three look like
// silence, and which peer it was waiting for depends on where in the cycle
// the fault landed. So every rank asks every other one directly, on a
// channel that shares nothing with the transport: each process answers
// probes on a TCP port of its own from a thread of its own (so a rank whose
// engine hangs still answers), and at start-up the ranks learn each other's
// host, pid and probe addresses. A probe then tells apart:
//   answered                      alive; the answer also says what each rank of
//                                 that process is doing (liveness.h's board)
//   refused, or no such pid       gone: the process died or was killed
//   accepted but never answered,  stopped (SIGSTOP, a debugger) or frozen: the
//     or stopped in /proc           host's kernel is there, the process is not
//   no answer from the host       unreachable: dead, stopped, or the network is down
// Peers on this rank's own host are read from /proc first.
//
// Plain C++17 and POSIX sockets: no MPI, no TensorFlow.
#pragma once

#include <string>
#include <vector>

#include "../transport/control_plane.h"
#include "probe_wire.h"

namespace ddl {

enum class PeerState { kAlive, kStopped, kGone, kUnreachable };

// What a probe learnt of one rank: its state and, when its process
// answered and the rank has an engine context there (the activity board
// of liveness.h, for the set asked about), what that engine is doing.
struct PeerView {
  int world_rank = -1;
  PeerState state = PeerState::kUnreachable;
  bool known = false;      // an activity line came for this rank and set
  uint64_t step = 0;       // collective steps its engine has entered
  bool inside = false;     // inside one now
  uint64_t moved = 0;      // bytes its transport has moved (Group::MovedBytes)
  // Its process has printed its fault report and is about to end (waiting
  // only for the other ranks to report theirs: see Engine::OnPeerFailure).
  bool ending = false;
};

// Every rank of a group, as learnt at start-up.
class PeerTable {
 public:
  // Collective over `group`: starts this process's probe responder (once
  // per process), exchanges identities with every rank of the group, and
  // gives every rank the group's secret (rank 0's `job_secret`, the text of
  // DDL_JOB_SECRET, or one it draws when that is empty), which its probes
  // send and its responder then answers (transport/probe_responder.h).
  static PeerTable Exchange(ControlPlane& group, const std::string& job_secret = "");

  const PeerIdentity* Find(int world_rank) const;
  const PeerIdentity& Me() const { return peers_[me_]; }
  // "rank 3 on node2".
  std::string Name(int world_rank) const;
  // The state of every other rank, probed at once (one connection per
  // process: ranks that share a process share its answer); returns within
  // about `patience_s` seconds.
  std::vector<std::pair<int, PeerState>> ProbeAll(double patience_s) const;
  // The same, with what each rank's engine of process set `set` does.
  std::vector<PeerView> Survey(double patience_s, int set) const;

 private:
  std::vector<PeerIdentity> peers_;  // by group rank
  int me_ = 0;
  std::string secret_;  // the group's (common/job_secret.h)
};

// The one line every live rank prints before it ends its process: which
// ranks it cannot reach, on which hosts, what is known of each, and in
// which phase (`phase`: "negotiation", "a data transfer", "shutdown") the
// fault hit. `what`: the transport's own account ("no progress for 5 s
// waiting for ..."); `awaited`: world ranks it was waiting for, if known.
std::string DescribeFault(const PeerTable& table, const std::string& phase,
                          const std::string& what, const std::vector<int>& awaited,
                          double patience_s);
// The same from states already probed (the liveness judge's, a moment ago).
std::string DescribeFault(const PeerTable& table, const std::string& phase,
                          const std::string& what, const std::vector<int>& awaited,
                          const std::vector<std::pair<int, PeerState>>& states);

}  // namespace ddl
