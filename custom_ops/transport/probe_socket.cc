#include "probe_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace ddl {

bool SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0 && errno != EINTR) return false;
    if (n > 0) sent += static_cast<size_t>(n);
  }
  return true;
}

std::vector<std::string> OwnAddresses() {
  std::vector<std::string> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) &&
        std::find(found.begin(), found.end(), text) == found.end()) {
      found.push_back(text);
    }
  }
  freeifaddrs(list);
  return found;
}

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

bool WaitForSockets(std::vector<SocketWait>* waits, int timeout_ms) {
  std::vector<pollfd> polled;
  for (const SocketWait& w : *waits) {
    polled.push_back({w.fd, static_cast<short>(w.connecting ? POLLOUT : POLLIN), 0});
  }
  const bool ok = poll(polled.data(), polled.size(), timeout_ms) >= 0 || errno == EINTR;
  for (size_t i = 0; i < polled.size(); ++i) (*waits)[i].ready = ok && polled[i].revents != 0;
  return ok;
}

int ConnectError(int fd) {
  int error = 0;
  socklen_t length = sizeof(error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
  return error;
}

bool IsRefusal(int error) { return error == ECONNREFUSED; }

ReadOutcome ReadSome(int fd, std::string* into) {
  char chunk[4096];
  const ssize_t got = recv(fd, chunk, sizeof chunk, 0);
  if (got > 0) {
    into->append(chunk, static_cast<size_t>(got));
    return ReadOutcome::kMore;
  }
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return ReadOutcome::kAgain;
  return ReadOutcome::kClosed;
}

void CloseSocket(int fd) { close(fd); }

}  // namespace ddl
