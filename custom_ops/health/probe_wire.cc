#include "probe_wire.h"

#include <cstdio>
#include <cstdlib>

#include "../common/job_secret.h"

namespace ddl {

namespace {

// The line a process that has reported its fault, and ends, puts first.
constexpr const char* kEndingLine = "E";

// Decimal digits only, no sign, no leading zero (so the text encodes back
// to itself), at most `max`; false otherwise.
bool ParseWhole(const std::string& text, uint64_t max, uint64_t* out) {
  if (text.empty() || text.size() > 20 || (text.size() > 1 && text[0] == '0')) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (digit > max || v > (max - digit) / 10) return false;  // past `max` (and 2^64)
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

// `text` cut at each `sep`: "a,b" -> {"a", "b"}; "" -> {""}.
std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == sep) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

// An IPv4 address as inet_ntop writes it (the form OwnAddresses gives):
// four decimal numbers of 0-255 without leading zeros, between dots.
// (By hand: sockets and their headers are transport/'s.)
bool CanonicalIPv4(const std::string& text) {
  const std::vector<std::string> parts = Split(text, '.');
  uint64_t octet = 0;
  if (parts.size() != 4) return false;
  for (const std::string& p : parts) {
    if (!ParseWhole(p, 255, &octet)) return false;
  }
  return true;
}

}  // namespace

std::string EncodeIdentity(const PeerIdentity& p) {
  std::string addresses;
  for (const std::string& a : p.addresses) addresses += (addresses.empty() ? "" : ",") + a;
  return p.host + "\n" + std::to_string(p.pid) + "\n" + std::to_string(p.port) + "\n" + addresses;
}

Status DecodeIdentity(const std::string& text, int world_rank, PeerIdentity* out) {
  auto refuse = [&](const std::string& what) {
    return Status::InvalidArgument("malformed probe identity of rank " +
                                   std::to_string(world_rank) + ": " + what);
  };
  const std::vector<std::string> fields = Split(text, '\n');
  if (fields.size() != 4) {
    return refuse(std::to_string(fields.size()) + " line(s), not 4 (host, pid, port, addresses)");
  }
  PeerIdentity p;
  p.world_rank = world_rank;
  p.host = fields[0];
  // A host name is at most 255 bytes (HOST_NAME_MAX + 1 with its NUL).
  if (p.host.empty() || p.host.size() > 255 || p.host.find('\0') != std::string::npos) {
    return refuse("host name of " + std::to_string(p.host.size()) +
                  " bytes (1-255, no NUL, expected)");
  }
  uint64_t pid = 0, port = 0;
  if (!ParseWhole(fields[1], 0x7fffffff, &pid) || pid == 0) {
    return refuse("pid '" + fields[1].substr(0, 32) + "' is not a whole number in 1-2147483647");
  }
  if (!ParseWhole(fields[2], 65535, &port)) {
    return refuse("port '" + fields[2].substr(0, 32) + "' is not a whole number in 0-65535");
  }
  p.pid = static_cast<int>(pid);
  p.port = static_cast<int>(port);
  if (!fields[3].empty()) {
    for (const std::string& a : Split(fields[3], ',')) {
      if (!CanonicalIPv4(a)) return refuse("address '" + a.substr(0, 32) + "' is not an IPv4 address");
      p.addresses.push_back(a);
    }
  }
  *out = std::move(p);
  return Status::Ok();
}

std::vector<char> EncodeIdentities(const std::string& secret,
                                   const std::vector<std::vector<char>>& identities) {
  std::vector<char> all(secret.begin(), secret.end());
  for (const auto& bytes : identities) {
    char length[9];
    std::snprintf(length, sizeof(length), "%08zu", bytes.size());
    all.insert(all.end(), length, length + 8);
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  return all;
}

Status SplitIdentities(const std::vector<char>& bytes, size_t count, std::string* secret,
                       std::vector<std::string>* identities) {
  auto refuse = [](const std::string& what) {
    return Status::InvalidArgument("malformed probe identities broadcast: " + what);
  };
  if (bytes.size() < kJobSecretBytes) {
    return refuse("cut short: " + std::to_string(bytes.size()) + " bytes, less than the " +
                  std::to_string(kJobSecretBytes) + "-byte secret");
  }
  secret->assign(bytes.data(), kJobSecretBytes);
  identities->clear();
  size_t at = kJobSecretBytes;
  for (size_t r = 0; r < count; ++r) {
    if (bytes.size() - at < 8) {
      return refuse("cut short at identity " + std::to_string(r) + " of " + std::to_string(count));
    }
    const std::string digits(bytes.data() + at, 8);
    // 8 digits, leading zeros and all (the encoder's %08zu).
    if (digits.find_first_not_of("0123456789") != std::string::npos) {
      return refuse("identity " + std::to_string(r) + "'s length is not 8 decimal digits");
    }
    const size_t length = std::strtoul(digits.c_str(), nullptr, 10);
    at += 8;
    if (length > bytes.size() - at) {
      return refuse("identity " + std::to_string(r) + " claims " + std::to_string(length) +
                    " bytes, " + std::to_string(bytes.size() - at) + " are left");
    }
    identities->emplace_back(bytes.data() + at, length);
    at += length;
  }
  if (at != bytes.size()) {
    return refuse(std::to_string(bytes.size() - at) + " byte(s) after the " +
                  std::to_string(count) + " identities");
  }
  return Status::Ok();
}

std::string EncodeProbeAnswer(const ProbeAnswer& answer) {
  std::string text(1, kProbeAnswerByte);
  if (answer.ending) text += std::string(kEndingLine) + "\n";
  for (const ActivityLine& l : answer.lines) {
    text += "A " + std::to_string(l.world_rank) + " " + std::to_string(l.set) + " " +
            std::to_string(l.step) + " " + (l.inside ? "1" : "0") + " " +
            std::to_string(l.moved) + "\n";
  }
  return text;
}

Status DecodeProbeAnswer(const std::string& bytes, ProbeAnswer* out) {
  auto refuse = [](const std::string& what) {
    return Status::InvalidArgument("malformed probe answer: " + what);
  };
  if (bytes.empty() || bytes[0] != kProbeAnswerByte) return refuse("no answer byte");
  if (bytes.size() > kMaxProbeAnswerBytes) {
    return refuse(std::to_string(bytes.size()) + " bytes, more than " +
                  std::to_string(kMaxProbeAnswerBytes));
  }
  if (bytes.size() > 1 && bytes.back() != '\n') return refuse("the last line has no end (cut short)");
  ProbeAnswer answer;
  const std::vector<std::string> lines =
      Split(bytes.size() > 1 ? bytes.substr(1, bytes.size() - 2) : "", '\n');
  for (size_t i = 0; i < lines.size() && bytes.size() > 1; ++i) {
    const std::string& line = lines[i];
    const std::string where = "line " + std::to_string(i + 1) + " '" + line.substr(0, 64) + "'";
    if (line == kEndingLine) {
      if (i != 0) return refuse(where + ": the ending line comes first or not at all");
      answer.ending = true;
      continue;
    }
    const std::vector<std::string> f = Split(line, ' ');
    uint64_t rank = 0, set = 0, inside = 0;
    ActivityLine a;
    if (f.size() != 6 || f[0] != "A") return refuse(where + ": not 'A rank set step inside moved'");
    if (!ParseWhole(f[1], 0x7fffffff, &rank) || !ParseWhole(f[2], 0x7fffffff, &set) ||
        !ParseWhole(f[3], UINT64_MAX, &a.step) || !ParseWhole(f[4], 1, &inside) ||
        !ParseWhole(f[5], UINT64_MAX, &a.moved)) {
      return refuse(where + ": a field is not a whole number in its range");
    }
    a.world_rank = static_cast<int>(rank);
    a.set = static_cast<int>(set);
    a.inside = inside == 1;
    answer.lines.push_back(a);
  }
  *out = std::move(answer);
  return Status::Ok();
}

}  // namespace ddl
