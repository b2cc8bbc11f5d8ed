// transport/probe_responder.h and common/job_secret.h on this machine's
// kernel: a caller with the secret gets the answer; a stranger (wrong,
// short or no secret) reads the end of the stream and not one byte; the
// port is not bound to the wildcard address; and a flood of idle
// connections neither blocks a real probe nor delays it past a fraction of
// the probe's patience. Prints "<N> checks, <F> failures".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/job_secret.h"
#include "transport/probe_responder.h"

using ddl_test::Expect;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kReply = "K an answer only the job may read\n";

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `say` (may be empty), then reads until the responder closes or
// `wait_s` passes; *closed says whether it closed.
std::string Ask(int port, const std::string& say, double wait_s, bool* closed) {
  *closed = false;
  const int fd = Connect(port);
  if (fd < 0) return "<no connection>";
  if (!say.empty()) send(fd, say.data(), say.size(), MSG_NOSIGNAL);
  std::string got;
  const auto end = Clock::now() + std::chrono::duration<double>(wait_s);
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (poll(&p, 1, left > 0 ? left : 0) <= 0) continue;
    char chunk[256];
    const ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    if (n > 0) {
      got.append(chunk, static_cast<size_t>(n));
      continue;
    }
    *closed = true;  // the end of the stream, or a reset: either way closed
    break;
  }
  close(fd);
  return got;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void SecretsFromText() {
  std::string bytes;
  Expect(ddl::ParseJobSecret("00112233445566778899aAbBcCdDeEfF", &bytes).ok() &&
             bytes.size() == ddl::kJobSecretBytes && bytes[1] == 0x11 &&
             static_cast<unsigned char>(bytes[15]) == 0xff,
         "32 hex digits in either case are a secret");
  const ddl::Status short_one = ddl::ParseJobSecret("abc", &bytes);
  Expect(!short_one.ok() && short_one.message().find("DDL_JOB_SECRET") != std::string::npos &&
             short_one.message().find("has 3 characters") != std::string::npos &&
             short_one.message().find("abc") == std::string::npos,
         "a short secret is refused naming the variable, not echoing it: " + short_one.message());
  const ddl::Status bad = ddl::ParseJobSecret("0011223344556677889900112233445g", &bytes);
  Expect(!bad.ok() && bad.message().find("character 32 is not a hexadecimal digit") !=
                          std::string::npos,
         "a non-hex digit is named by its place: " + bad.message());
  const std::string a = ddl::DrawJobSecret(), b = ddl::DrawJobSecret();
  Expect(a.size() == ddl::kJobSecretBytes && a != b, "two drawn secrets differ");
  Expect(ddl::SameJobSecret(a, a) && !ddl::SameJobSecret(a, b) &&
             !ddl::SameJobSecret(a, a.substr(0, 15)),
         "secrets compare equal only when every byte is");
}

void AnswersOnlyItsJob(ddl::ProbeResponder& responder, const std::string& secret) {
  const int port = responder.port();
  Expect(port > 0, "the responder has a port");
  bool closed = false;
  std::string got = Ask(port, secret, 2, &closed);
  Expect(got == kReply && closed, "the job's secret gets the answer, then the end: '" + got + "'");

  std::string wrong = secret;
  wrong[7] ^= 1;
  got = Ask(port, wrong, 2, &closed);
  Expect(got.empty() && closed,
         "a wrong secret reads zero bytes and the end: " + std::to_string(got.size()));
  got = Ask(port, wrong + secret, 2, &closed);
  Expect(got.empty() && closed, "a wrong secret followed by the right one reads nothing");
  const auto start = Clock::now();
  got = Ask(port, secret.substr(0, 10), 4, &closed);
  const double held = SecondsSince(start);
  // At least the hold time; at most a few times it (a busy machine).
  Expect(got.empty() && closed && held >= 0.45 && held < 3,
         "a short secret reads nothing and is closed after the hold time: " +
             std::to_string(held) + " s");
  got = Ask(port, "", 3, &closed);
  Expect(got.empty() && closed, "silence reads nothing and is closed");
  got = Ask(port, std::string(4096, 'x'), 3, &closed);
  Expect(got.empty() && closed, "4 KiB of junk reads nothing");
  // A secret that trickles in a byte at a time still counts (a slow link).
  const int fd = Connect(port);
  for (char c : secret) {
    send(fd, &c, 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string trickled;
  char chunk[256];
  for (ssize_t n; (n = recv(fd, chunk, sizeof chunk, 0)) > 0;) trickled.append(chunk, n);
  close(fd);
  Expect(trickled == kReply, "a secret sent a byte at a time is answered");
}

// /proc/net/tcp's listening sockets (state 0A) on `port`: their local
// addresses, as hex ("0100007F" is 127.0.0.1, "00000000" the wildcard).
std::vector<std::string> ListeningAddresses(int port) {
  std::ifstream table("/proc/net/tcp");
  std::vector<std::string> found;
  std::string line;
  std::getline(table, line);
  char want[8];
  std::snprintf(want, sizeof want, "%04X", port);
  while (std::getline(table, line)) {
    std::istringstream row(line);
    std::string slot, local, remote, state;
    row >> slot >> local >> remote >> state;
    if (state == "0A" && local.substr(local.find(':') + 1) == want) {
      found.push_back(local.substr(0, local.find(':')));
    }
  }
  return found;
}

void NotOnTheWildcard(ddl::ProbeResponder& responder) {
  const std::vector<std::string> listening = ListeningAddresses(responder.port());
  bool wildcard = false, loopback = false;
  for (const std::string& a : listening) {
    wildcard |= a == "00000000";
    loopback |= a == "0100007F";
  }
  Expect(loopback && !wildcard &&
             listening.size() == 1 + responder.addresses().size(),
         "the port listens on loopback and each interface address, never the wildcard (" +
             std::to_string(listening.size()) + " sockets, " +
             std::to_string(responder.addresses().size()) + " interface addresses)");
}

// `idle` connections that never say anything, held open, then real probes:
// each answered, none slower than half the shortest patience (1 s); on an
// idle machine each takes well under a millisecond.
void IdleFloodDoesNotBlock(ddl::ProbeResponder& responder, const std::string& secret, int idle) {
  std::vector<int> strangers;
  for (int i = 0; i < idle; ++i) {
    const int fd = Connect(responder.port());
    if (fd >= 0) strangers.push_back(fd);
  }
  Expect(static_cast<int>(strangers.size()) == idle,
         "every idle connection was accepted by the kernel: " + std::to_string(strangers.size()));
  double slowest = 0;
  int answered = 0;
  for (int probe = 0; probe < 20; ++probe) {
    const auto start = Clock::now();
    bool closed = false;
    answered += Ask(responder.port(), secret, 2, &closed) == kReply;
    slowest = std::max(slowest, SecondsSince(start));
    // More idle ones while the probes run, as a flood keeps coming.
    for (int i = 0; i < idle / 20; ++i) {
      const int fd = Connect(responder.port());
      if (fd >= 0) strangers.push_back(fd);
    }
  }
  Expect(answered == 20 && slowest < 0.5,
         "with " + std::to_string(idle) + " idle connections every probe is answered (" +
             std::to_string(answered) + " of 20), the slowest in " + std::to_string(slowest) +
             " s");
  // Not one stranger read a byte.
  size_t leaked = 0;
  for (int fd : strangers) {
    char chunk[64];
    const ssize_t n = recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) leaked += static_cast<size_t>(n);
    close(fd);
  }
  Expect(leaked == 0, "the idle connections read nothing: " + std::to_string(leaked) + " bytes");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  // One responder per process, as in a rank; checks without captures
  // reach it and its secret through these.
  static ddl::ProbeResponder& responder = ddl::ProbeResponder::Start([] { return kReply; });
  static const std::string secret = ddl::DrawJobSecret();
  responder.Admit(secret);
  responder.Admit(ddl::DrawJobSecret());  // a process set's: both answered
  return ddl_test::RunNamedChecks(
      {{"secrets", SecretsFromText},
       {"answers-only-its-job", [] { AnswersOnlyItsJob(responder, secret); }},
       {"wildcard", [] { NotOnTheWildcard(responder); }},
       {"idle-flood", [] { IdleFloodDoesNotBlock(responder, secret, 1000); }}},
      only);
}
