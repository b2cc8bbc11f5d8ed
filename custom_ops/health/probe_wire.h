// What the probe channel (fault_report.h) carries, encoded and decoded
// here, apart from the sockets, so the decoders can be fuzzed alone
// (tests/core/fuzz/targets.cc):
//   - an identity: what a rank tells its group at start-up (host, pid,
//     probe port, addresses), and rank 0's broadcast of every identity
//     after the group's secret;
//   - a probe answer: the answer byte, then the activity lines of the
//     answering process's ranks (liveness.h's board).
// Each decoder takes bytes from another process and refuses anything but
// what its encoder makes, naming what was wrong: a short field, a number
// out of range, a count the bytes do not hold, trailing bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/types.h"

namespace ddl {

struct PeerIdentity {
  int world_rank = -1;
  std::string host;
  int pid = 0;
  int port = 0;  // of its probe responder; 0 if it has none
  std::vector<std::string> addresses;  // its IPv4 addresses other than loopback
};

// "host\npid\nport\naddr,addr": one rank's identity (the world rank is
// not sent: the group's order gives it).
std::string EncodeIdentity(const PeerIdentity& p);
Status DecodeIdentity(const std::string& text, int world_rank, PeerIdentity* out);

// Rank 0's broadcast: the secret (kJobSecretBytes), then each rank's
// identity after its length as 8 decimal digits.
std::vector<char> EncodeIdentities(const std::string& secret,
                                   const std::vector<std::vector<char>>& identities);
// Refused unless it holds the secret and exactly `count` identities.
Status SplitIdentities(const std::vector<char>& bytes, size_t count, std::string* secret,
                       std::vector<std::string>* identities);

// The byte that opens every answer of a responder.
constexpr char kProbeAnswerByte = 'K';
// The most an answer may hold: a line per rank and process set of the
// answering process (about 60 bytes each) fits many times over.
constexpr size_t kMaxProbeAnswerBytes = 4 << 20;

// One activity line: "A <world rank> <set> <step> <inside 0|1> <moved>\n".
struct ActivityLine {
  int world_rank = 0;
  int set = 0;
  uint64_t step = 0;
  bool inside = false;
  uint64_t moved = 0;
};
struct ProbeAnswer {
  bool ending = false;  // kEndingLine came first: the process ends
  std::vector<ActivityLine> lines;
};
std::string EncodeProbeAnswer(const ProbeAnswer& answer);
Status DecodeProbeAnswer(const std::string& bytes, ProbeAnswer* out);

}  // namespace ddl
