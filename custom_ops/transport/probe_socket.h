// The TCP sockets of the fault report's probe channel (health/fault_report.h):
// a channel that shares nothing with the job's transport, so a rank can
// still ask a peer whether it lives when the transport itself is stuck.
// Plain POSIX sockets over IPv4; what is said on the channel (the answer,
// the activity lines) is the fault report's business, not this file's.
#pragma once

#include <string>
#include <vector>

namespace ddl {

// Sends all of `bytes` on `fd`; false when it stopped early (the peer went
// away, or a non-blocking socket's buffer is full).
bool SendAll(int fd, const std::string& bytes);

// This host's IPv4 addresses of interfaces that are up, loopback left out,
// each once.
std::vector<std::string> OwnAddresses();

// Starts a non-blocking connection to address:port; -1 if it failed at
// once (then `refused` says whether the host said no).
int StartConnect(const std::string& address, int port, bool* refused);

// One socket a caller waits on: for its connection to finish
// (`connecting`), else for bytes to read. `ready` is set by WaitForSockets.
struct SocketWait {
  int fd = -1;
  bool connecting = false;
  bool ready = false;
};
// Waits up to `timeout_ms` for any of `waits` to be ready; false when the
// wait itself failed (not merely timed out).
bool WaitForSockets(std::vector<SocketWait>* waits, int timeout_ms);

// A finished connection attempt's outcome: 0 connected, else the errno
// (ECONNREFUSED: the host said no).
int ConnectError(int fd);
bool IsRefusal(int error);

// Reads what `fd` has into `into`. kMore: read some; kAgain: nothing yet
// (interrupted); kClosed: the peer closed, or the read failed.
enum class ReadOutcome { kMore, kAgain, kClosed };
ReadOutcome ReadSome(int fd, std::string* into);

void CloseSocket(int fd);

}  // namespace ddl
