// Counting checks for the core's test programs: each failed expectation
// prints one line; Summary prints "<N> checks, <F> failures" (what
// tests/core/test_core.py reads) and gives the exit code.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace ddl_test {

// Atomic: the threads-as-ranks checks expect from every rank's thread at
// once (ThreadSanitizer reported the plain counters as a data race).
inline std::atomic<int>& Checks() {
  static std::atomic<int> n{0};
  return n;
}
inline std::atomic<int>& Failures() {
  static std::atomic<int> n{0};
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
  std::printf("%d checks, %d failures\n", Checks().load(), Failures().load());
  return Failures() ? 1 : 0;
}

// Whether `only` selects `name`: empty selects every check; "a,b" those
// named; "-a,b" every check but those (so a test can run the slow checks in
// processes of their own beside one that runs the rest).
inline bool Selected(const std::string& only, const std::string& name) {
  if (only.empty()) return true;
  const bool except = only[0] == '-';
  const std::string list = "," + only.substr(except ? 1 : 0) + ",";
  return (list.find("," + name + ",") != std::string::npos) != except;
}

// Runs each check `only` selects, a check that throws counting as one
// failure, prints each one's seconds, and returns Summary().
inline int RunNamedChecks(const std::vector<std::pair<std::string, void (*)()>>& checks,
                          const std::string& only) {
  for (const auto& [name, check] : checks) {
    if (!Selected(only, name)) continue;
    const auto start = std::chrono::steady_clock::now();
    try {
      check();
    } catch (const std::exception& e) {
      Expect(false, name + ": " + e.what());
    }
    std::printf("%s: %.2f s\n", name.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
  }
  return Summary();
}

}  // namespace ddl_test
