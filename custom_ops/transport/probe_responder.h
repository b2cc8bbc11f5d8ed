// The probe responder: a TCP port per process, answered from a thread of
// its own, through which the job's other ranks learn that this process is
// alive and what its ranks do (health/fault_report.h).
//
// Only the job's own processes get an answer. A caller first sends one of
// the secrets this process was given (common/job_secret.h); a stranger
// (wrong secret, short secret, nothing at all) gets the connection closed
// and not one byte. The port listens on this host's own addresses as they
// are at start-up (loopback and each IPv4 address of an interface that is
// up), never on the wildcard address, so an interface added later (a VPN,
// a container bridge) does not expose it.
//
// One idle caller cannot hold the responder: every connection is served
// from one poll loop, has kHoldMs to send its secret (the job's probers
// send it at once), and when kMaxCallers wait at once the oldest is
// closed. A flood of idle connections thus costs a real probe at most the
// moment it takes to be accepted, well inside the probe's patience (1-3 s).
//
// Plain C++17 and POSIX sockets: no MPI, no engine.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace ddl {

class ProbeResponder {
 public:
  // How long a caller may take to send its secret, or to read its answer.
  static constexpr int kHoldMs = 500;
  // Callers waiting at once; a new one beyond closes the oldest.
  static constexpr size_t kMaxCallers = 64;

  // The process's responder, started by the first call with `answer` (what
  // a caller with a secret is sent, made afresh for each); later calls
  // return the same responder and ignore `answer`. It lives until the
  // process ends.
  static ProbeResponder& Start(std::function<std::string()> answer);

  // 0 when no port could be opened (the other ranks then call this
  // process unreachable, as they would a dead one).
  int port() const { return port_; }
  // This host's IPv4 addresses other than loopback, as found at start-up
  // (the ones the port listens on, when it has one).
  const std::vector<std::string>& addresses() const { return addresses_; }

  // From now on a caller sending `secret` is answered (one per group set
  // up in this process: the world and each process set).
  void Admit(const std::string& secret);

 private:
  explicit ProbeResponder(std::function<std::string()> answer);
  bool Listen();
  void Serve();
  bool Admitted(const std::string& secret);

  std::function<std::string()> answer_;
  std::vector<int> listeners_;
  int port_ = 0;
  std::vector<std::string> addresses_;
  std::mutex mutex_;  // guards secrets_ (Admit runs on the set-up thread)
  std::vector<std::string> secrets_;
};

}  // namespace ddl
