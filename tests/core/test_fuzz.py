"""The decoders of bytes from outside the process, fuzzed
(tests/core/fuzz/targets.h): the negotiation requests and responses a
rank's peers send, and the DDL_* values of the environment. In the suite, the seeded mutation driver
(tests/core/fuzz/driver.cc) built with gcc and AddressSanitizer +
UndefinedBehaviorSanitizer runs every corpus file of
tests/core/fuzz_corpus/ as it is (the seeds and the regression cases of
the bugs fuzzing found), then mutants for 3 s per target; allocations
above 64 MiB are findings (no input here justifies one). The seed is
DDL_FUZZ_SEED, else the day's date, so a finding repeats the same day.

With clang, libFuzzer runs each target (10 minutes each in docs/testing.md):
    tests/core/fuzz/run_libfuzzer.sh <target> 600"""

import datetime
import os
import subprocess

from test_core import CORE_TESTS, OPS, compiler

FUZZ = os.path.join(CORE_TESTS, "fuzz")
CORPUS = os.path.join(CORE_TESTS, "fuzz_corpus")
SOURCES = [os.path.join(FUZZ, "driver.cc"), os.path.join(FUZZ, "targets.cc"),
           os.path.join(OPS, "negotiation", "message.cc"),
           *(os.path.join(OPS, "common", f) for f in ("types.cc", "config.cc", "job_secret.cc"))]
FLAGS = ["-std=c++17", "-O1", "-g", "-pthread", f"-I{OPS}", f"-I{FUZZ}",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
# What each regression case of the corpus is refused with: the bugs the
# driver found in the decoders before they checked counts, codes and ends.
REGRESSIONS = {
    "negotiation_requests/regress-count-4g":
        "malformed negotiation message: 4294967295 requests cannot fit in the 0 bytes left",
    "negotiation_requests/regress-shape-count-4g":
        "malformed negotiation message: 4294967280 dimensions cannot fit in the 28 bytes left",
    "negotiation_requests/regress-trailing-byte":
        "malformed negotiation message: requests has 1 byte(s) after its end, at 58 of 59",
    "negotiation_requests/regress-unknown-dtype":
        "malformed negotiation message: dtype code 200 is unknown",
    "negotiation_responses/regress-ready-count-4g":
        "malformed negotiation message: 805306368 ready names cannot fit in the 198 bytes left",
    "negotiation_responses/regress-trailing-byte":
        "malformed negotiation message: responses has 1 byte(s) after its end, at 202 of 203",
}


def test_decoders_survive_the_seeded_mutation_driver(tmp_path):
    exe = tmp_path / "fuzz_driver"
    subprocess.run([compiler(), *FLAGS, *SOURCES, "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    seed = os.environ.get("DDL_FUZZ_SEED", datetime.date.today().strftime("%Y%m%d"))
    proc = subprocess.run([str(exe), CORPUS, "3", seed], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, ASAN_OPTIONS=(
                              "max_allocation_size_mb=64:allocator_may_return_null=0:"
                              "halt_on_error=1:detect_leaks=1")))
    where = f"(DDL_FUZZ_SEED={seed}) " + proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.returncode == 0 and "FUZZ FINDING" not in proc.stderr, where
    outcomes = dict(line.split(": ", 1) for line in proc.stdout.splitlines()
                    if "/" in line.split(": ")[0])
    for case, refusal in REGRESSIONS.items():
        assert outcomes.get(case) == "refused: " + refusal, (case, where)
    seeds = [c for c in outcomes if "/seed-" in c and c.startswith("negotiation_")]
    assert len(seeds) >= 6 and all(outcomes[c] == "decoded" for c in seeds), where
    settings = [c for c in outcomes if c.startswith("ddl_settings/")]
    assert len(settings) >= 20, where
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failures") and int(last.split()[0]) > 10000, where
