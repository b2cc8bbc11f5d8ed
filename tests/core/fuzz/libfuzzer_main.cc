// One target (chosen at compile time with -DDDL_FUZZ_TARGET=\"name\") as a
// libFuzzer binary (clang++ -fsanitize=fuzzer,address,undefined); see
// docs/testing.md for the command that runs each for 10 minutes.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "targets.h"

namespace {

ddl_fuzz::Target Chosen() {
  for (const auto& t : ddl_fuzz::Targets()) {
    if (std::strcmp(t.name, DDL_FUZZ_TARGET) == 0) return t.run;
  }
  std::fprintf(stderr, "no fuzz target named %s\n", DDL_FUZZ_TARGET);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ddl_fuzz::Target target = Chosen();
  target(data, size);
  return 0;
}
