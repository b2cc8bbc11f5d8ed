// Counting checks for the core's test programs: each failed expectation
// prints one line; Summary prints "<N> checks, <F> failures" (what
// tests/test_core.py reads) and gives the exit code.
#pragma once

#include <cstdio>
#include <string>

namespace ddl_test {

inline int& Checks() {
  static int n = 0;
  return n;
}
inline int& Failures() {
  static int n = 0;
  return n;
}

inline void Expect(bool ok, const std::string& what) {
  ++Checks();
  if (!ok) {
    ++Failures();
    std::printf("FAIL %s\n", what.c_str());
  }
}

inline int Summary() {
  std::printf("%d checks, %d failures\n", Checks(), Failures());
  return Failures() ? 1 : 0;
}

}  // namespace ddl_test
