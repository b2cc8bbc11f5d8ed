#include "probe_responder.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

#include "../common/job_secret.h"
#include "probe_socket.h"

namespace ddl {

namespace {

using Clock = std::chrono::steady_clock;

// A listening socket on address:port (port 0: any free one); -1 and errno
// when it cannot be had.
int ListenOn(const std::string& address, int port) {
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &at.sin_addr) != 1) {
    errno = EINVAL;
    return -1;
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 || listen(fd, 128) != 0) {
    const int error = errno;
    close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

int PortOf(int fd) {
  sockaddr_in at{};
  socklen_t length = sizeof(at);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&at), &length) != 0) return 0;
  return ntohs(at.sin_port);
}

// One connection to the responder.
struct Caller {
  int fd = -1;
  Clock::time_point deadline;
  std::string secret;  // what it sent so far
  std::string reply;   // set once its secret is known: the answer, being sent
  size_t sent = 0;
};

}  // namespace

ProbeResponder& ProbeResponder::Start(std::function<std::string()> answer) {
  // Never destroyed: its thread serves until the process ends.
  static ProbeResponder* responder = new ProbeResponder(std::move(answer));
  return *responder;
}

ProbeResponder::ProbeResponder(std::function<std::string()> answer)
    : answer_(std::move(answer)), addresses_(OwnAddresses()) {
  if (!Listen()) return;  // no responder: the other ranks call this one unreachable
  std::thread(&ProbeResponder::Serve, this).detach();
}

// One port on every address: loopback first (port chosen by the kernel),
// then the same port on each interface address. Another program may hold
// that port on one of them, so a few ports are tried.
bool ProbeResponder::Listen() {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int first = ListenOn("127.0.0.1", 0);
    if (first < 0) return false;
    const int port = PortOf(first);
    std::vector<int> fds = {first};
    bool taken = false;
    for (const std::string& address : addresses_) {
      const int fd = ListenOn(address, port);
      if (fd >= 0) {
        fds.push_back(fd);
      } else if (errno == EADDRINUSE) {
        taken = true;
        break;
      }
      // Any other failure (the address went away since it was listed):
      // peers trying it find nothing, as they would a down interface.
    }
    if (taken || port == 0) {
      for (int fd : fds) close(fd);
      continue;
    }
    listeners_ = fds;
    port_ = port;
    return true;
  }
  return false;
}

void ProbeResponder::Admit(const std::string& secret) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(secrets_.begin(), secrets_.end(), secret) == secrets_.end()) {
    secrets_.push_back(secret);
  }
}

bool ProbeResponder::Admitted(const std::string& secret) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool found = false;
  // Every secret compared, none skipped: the time says nothing either.
  for (const std::string& s : secrets_) found |= SameJobSecret(s, secret);
  return found;
}

void ProbeResponder::Serve() {
  std::deque<Caller> callers;  // in the order they came: the oldest first
  auto drop = [](Caller& c) {
    close(c.fd);
    c.fd = -1;
  };
  for (;;) {
    const auto now = Clock::now();
    for (Caller& c : callers) {
      if (c.fd >= 0 && now >= c.deadline) drop(c);
    }
    callers.erase(std::remove_if(callers.begin(), callers.end(),
                                 [](const Caller& c) { return c.fd < 0; }),
                  callers.end());
    std::vector<pollfd> waiting;
    for (int fd : listeners_) waiting.push_back({fd, POLLIN, 0});
    int timeout = -1;  // nobody connected: sleep until someone does
    for (const Caller& c : callers) {
      waiting.push_back({c.fd, static_cast<short>(c.reply.empty() ? POLLIN : POLLOUT), 0});
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count() + 1;
      timeout = timeout < 0 ? static_cast<int>(left) : std::min(timeout, static_cast<int>(left));
    }
    if (poll(waiting.data(), waiting.size(), timeout) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    // Callers first (their indices follow the listeners'), then new ones.
    for (size_t i = listeners_.size(); i < waiting.size(); ++i) {
      Caller& c = callers[i - listeners_.size()];
      if (waiting[i].revents == 0 || c.fd < 0) continue;
      if (c.reply.empty()) {
        char bytes[kJobSecretBytes];
        const ssize_t got = recv(c.fd, bytes, kJobSecretBytes - c.secret.size(), 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) {
          drop(c);  // gone before it said anything
          continue;
        }
        c.secret.append(bytes, static_cast<size_t>(got));
        if (c.secret.size() < kJobSecretBytes) continue;
        if (!Admitted(c.secret)) {
          drop(c);  // a stranger: closed, nothing said
          continue;
        }
        c.reply = answer_();
        c.deadline = Clock::now() + std::chrono::milliseconds(kHoldMs);
      }
      // The answer, as much as the socket takes now; the rest when it
      // takes more (a prober that stopped reading runs out its deadline).
      const ssize_t n = send(c.fd, c.reply.data() + c.sent, c.reply.size() - c.sent,
                             MSG_NOSIGNAL);
      if (n > 0) c.sent += static_cast<size_t>(n);
      if (c.sent == c.reply.size() || (n < 0 && errno != EINTR && errno != EAGAIN)) drop(c);
    }
    for (size_t i = 0; i < listeners_.size(); ++i) {
      if (waiting[i].revents == 0) continue;
      for (;;) {
        const int fd = accept4(listeners_[i], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) {
            // Out of descriptors: make room by dropping the oldest caller,
            // or wait a moment if there is none of ours to drop.
            auto oldest = std::find_if(callers.begin(), callers.end(),
                                       [](const Caller& c) { return c.fd >= 0; });
            if (oldest != callers.end()) {
              drop(*oldest);
              continue;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          break;  // EAGAIN: all taken; anything else: try at the next poll
        }
        size_t open = 0;
        for (const Caller& c : callers) open += c.fd >= 0;
        if (open >= kMaxCallers) {
          drop(*std::find_if(callers.begin(), callers.end(),
                             [](const Caller& c) { return c.fd >= 0; }));
        }
        Caller c;
        c.fd = fd;
        c.deadline = Clock::now() + std::chrono::milliseconds(kHoldMs);
        callers.push_back(std::move(c));
      }
    }
  }
}

}  // namespace ddl
