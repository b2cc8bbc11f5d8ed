// Fuzz targets: one function per decoder of bytes that come from outside
// the process. Each takes any bytes and either decodes them or refuses
// them with an error naming what was wrong; anything else (a crash, an
// exception of another kind, an allocation the bytes do not justify, a
// decode that ignores bytes) is a finding, reported by Fail (abort).
//
// Built two ways: with clang's libFuzzer (fuzz/libfuzzer_main.cc, one
// target per binary) and, in the suite, with gcc and a seeded mutation
// driver (fuzz/driver.cc, every target for a bounded time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddl_fuzz {

// Returns the refusal's message, or "" when the bytes decoded.
using Target = std::string (*)(const uint8_t* data, size_t size);

struct NamedTarget {
  const char* name;  // also its corpus folder: tests/core/fuzz_corpus/<name>/
  Target run;
  // Inputs made by this build's encoders: a start for the mutations.
  std::vector<std::string> (*seeds)();
};

const std::vector<NamedTarget>& Targets();

// Prints what was wrong and the input (hex), then aborts.
[[noreturn]] void Fail(const std::string& what, const uint8_t* data, size_t size);

}  // namespace ddl_fuzz
