#include "job_secret.h"

#include <cstdio>
#include <random>

namespace ddl {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Status ParseJobSecret(const std::string& text, std::string* out) {
  // The value itself is never echoed: a near miss of the real secret is
  // most of it.
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("environment variable DDL_JOB_SECRET is invalid: expected " +
                                   std::to_string(2 * kJobSecretBytes) +
                                   " hexadecimal digits (" + why + ")");
  };
  if (text.size() != 2 * kJobSecretBytes) {
    return refuse("it has " + std::to_string(text.size()) + " characters");
  }
  std::string bytes(kJobSecretBytes, '\0');
  for (size_t i = 0; i < kJobSecretBytes; ++i) {
    const int high = HexValue(text[2 * i]), low = HexValue(text[2 * i + 1]);
    if (high < 0 || low < 0) {
      return refuse("character " + std::to_string(high < 0 ? 2 * i + 1 : 2 * i + 2) +
                    " is not a hexadecimal digit");
    }
    bytes[i] = static_cast<char>(high * 16 + low);
  }
  *out = bytes;
  return Status::Ok();
}

std::string DrawJobSecret() {
  std::string bytes(kJobSecretBytes, '\0');
  if (FILE* urandom = std::fopen("/dev/urandom", "rb")) {
    const size_t got = std::fread(&bytes[0], 1, bytes.size(), urandom);
    std::fclose(urandom);
    if (got == bytes.size()) return bytes;
  }
  // No /dev/urandom (a bare chroot): libstdc++'s random_device reads the
  // CPU's or the kernel's generator (getrandom), never a fixed seed.
  std::random_device device;
  for (char& b : bytes) b = static_cast<char>(device() & 0xff);
  return bytes;
}

bool SameJobSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return differ == 0;
}

}  // namespace ddl
