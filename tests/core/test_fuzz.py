"""The decoders of bytes from outside the process, fuzzed
(tests/core/fuzz/targets.h): the negotiation requests and responses a
rank's peers send, the DDL_* values of the environment, the settings
agreement, the probe channel's identities and answers, and the autotune
table file. In the suite, the seeded mutation driver
(tests/core/fuzz/driver.cc) built with gcc and AddressSanitizer +
UndefinedBehaviorSanitizer runs every corpus file of
tests/core/fuzz_corpus/ as it is (the seeds and the regression cases of
the bugs fuzzing found), then mutants for 1 s per target; allocations
above 64 MiB are findings (no input here justifies one). The seed is
DDL_FUZZ_SEED, else the day's date, so a finding repeats the same day.

With clang, libFuzzer runs each target (10 minutes each in docs/testing.md):
    tests/core/fuzz/run_libfuzzer.sh <target> 600"""

import datetime
import os
import subprocess
import sys

from test_core import CORE_TESTS, OPS, CoreObjects, compiler

FUZZ = os.path.join(CORE_TESTS, "fuzz")
CORPUS = os.path.join(CORE_TESTS, "fuzz_corpus")
SOURCES = [os.path.join(FUZZ, "driver.cc"), os.path.join(FUZZ, "targets.cc"),
           os.path.join(OPS, "negotiation", "message.cc"),
           *(os.path.join(OPS, "common", f) for f in ("types.cc", "config.cc", "job_secret.cc")),
           os.path.join(OPS, "health", "probe_wire.cc"),
           *(os.path.join(OPS, "tuning", f) for f in ("autotune.cc", "autotune_settings.cc"))]
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
    # The settings agreement ignored values past the table's and a value
    # cut short, and read missing ones as "".
    "settings_agreement/regress-extra-value":
        "malformed shared settings: 5 byte(s) after the 2 values this build shares",
    "settings_agreement/regress-cut-short":
        "malformed shared settings: cut short: 1 byte(s) after value 1 without their end",
    "settings_agreement/regress-too-few": "malformed shared settings: 1 values where this "
        "build shares 3 (another keras_ddl build's settings table?)",
    # The identities: atoi made any pid a number, a length past the end
    # was read short, a missing identity or trailing bytes went unseen.
    "probe_identities/regress-pid-not-number": "malformed probe identity of rank 0: "
        "pid 'x1' is not a whole number in 1-2147483647",
    "probe_identities/regress-length-past-end":
        "malformed probe identities broadcast: identity 0 claims 999 bytes, 10 are left",
    "probe_identities/regress-missing-identity":
        "malformed probe identities broadcast: cut short at identity 1 of 2",
    "probe_identities/regress-trailing-byte":
        "malformed probe identities broadcast: 1 byte(s) after the 1 identities",
    "probe_identities/regress-bad-address":
        "malformed probe identity of rank 0: address '' is not an IPv4 address",
    # The answer: lines that did not read were skipped; the driver found
    # the new decoder's range check wrapping below zero (inside = 3).
    "probe_answer/regress-inside-3": "malformed probe answer: line 1 'A 1 0 5 3 7': "
        "a field is not a whole number in its range",
    "probe_answer/regress-cut-short":
        "malformed probe answer: the last line has no end (cut short)",
    "probe_answer/regress-ending-late":
        "malformed probe answer: line 2 'E': the ending line comes first or not at all",
    # The autotune table: atof read "2e-4x" and "-0.0002" as medians,
    # and anything after the last line was ignored.
    "autotune_table/regress-median-not-number":
        "malformed line 'class 0 chosen 0 median_seconds 0.0001 2e-4x 0.0003'",
    "autotune_table/regress-negative-median":
        "malformed line 'class 0 chosen 0 median_seconds 0.0001 -0.0002 0.0003'",
    "autotune_table/regress-trailing-line": "it has bytes after its last line",
    "autotune_table/regress-cut-short": "it ends early",
}


def test_decoders_survive_the_seeded_mutation_driver(tmp_path):
    exe = tmp_path / "fuzz_driver"
    objects = CoreObjects(str(tmp_path), FLAGS).get(SOURCES)  # two at a time
    subprocess.run([compiler(), *FLAGS, *objects, "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    seed = os.environ.get("DDL_FUZZ_SEED", datetime.date.today().strftime("%Y%m%d"))
    proc = subprocess.run([str(exe), CORPUS, "1", seed], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, ASAN_OPTIONS=(
                              "max_allocation_size_mb=64:allocator_may_return_null=0:"
                              "halt_on_error=1:detect_leaks=1")))
    where = f"(DDL_FUZZ_SEED={seed}) " + proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.returncode == 0 and "FUZZ FINDING" not in proc.stderr, where
    outcomes = dict(line.split(": ", 1) for line in proc.stdout.splitlines()
                    if "/" in line.split(": ")[0])
    for case, refusal in REGRESSIONS.items():
        assert outcomes.get(case) == "refused: " + refusal, (case, where)
    seeds = [c for c in outcomes if "/seed-" in c and not c.startswith("ddl_settings/")]
    assert len(seeds) >= 17 and all(outcomes[c] == "decoded" for c in seeds), where
    settings = [c for c in outcomes if c.startswith("ddl_settings/")]
    assert len(settings) >= 20, where
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failures") and int(last.split()[0]) > 10000, where


# The Python decoders of files (tests/core/fuzz/files.py): what each
# regression case is refused with, after the file's path. The bugs: a
# hostfile's bad bytes and a results file or meta.json cut short raised
# errors naming no file; check() raised on launches of another type;
# meta.json could name a file outside the backup, a range past
# variables.bin or an object dtype; the first cut of the new readers read
# 64 MiB into a buffer for any file (read(limit + 1)).
FILE_REGRESSIONS = {
    "hostfile/regress-not-utf8": "hostfile:2: byte 0xff is not UTF-8 text",
    "hostfile/regress-nul-byte": "hostfile:2: a NUL byte: a hostfile is text",
    "results_file/regress-cut-short": "results.json: not JSON (cut short or damaged?): ",
    "results_file/regress-launches-not-list":
        "results.json: not a complete results file: 'launches' is not a list; no launches",
    "results_file/regress-launch-not-object": "results.json: not a complete results file: "
        "launch 0: not an object with a 'meta' object",
    "results_file/regress-a-list": "results.json: holds a JSON list, not an object",
    "backup/regress-meta-cut-short": "meta.json: not JSON (cut short or damaged?): ",
    "backup/regress-file-outside": "meta.json: 'files' names '../../../etc/hostname', not "
        "variables.bin or a rank-NNNNN.npz",
    "backup/regress-offset-past-end": "meta.json: variable 0 (dense/kernel): bytes 4096+48 "
        "are not its float32[3, 4] at an aligned offset inside variables.bin",
    "backup/regress-object-dtype":
        "meta.json: variable 1 (dense/bias): dtype 'object' is not a numeric dtype's name",
    # Found by test_bad_files.py's mutants: a variable's offset moved to
    # another's, in range, read the wrong bytes (meta.json had no checksum).
    "backup/regress-offset-moved":
        "meta.json: its values do not match its own checksum 'meta_crc' (damaged or edited)",
    "backup/regress-variables-cut-short": "variables.bin: 189 bytes, meta.json says 194 (cut "
        "short?)",
}


def test_file_decoders_survive_the_seeded_mutation_driver(tmp_path):
    seed = os.environ.get("DDL_FUZZ_SEED", datetime.date.today().strftime("%Y%m%d"))
    proc = subprocess.run([sys.executable, os.path.join(FUZZ, "files.py"), "--seconds", "2",
                           "--seed", seed, "--findings", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    where = f"(DDL_FUZZ_SEED={seed}) " + proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.returncode == 0 and "FUZZ FINDING" not in proc.stderr, where
    outcomes = dict(line.split(": ", 1) for line in proc.stdout.splitlines()
                    if "/" in line.split(": ")[0])
    for case, refusal in FILE_REGRESSIONS.items():
        assert outcomes.get(case, "").startswith("refused: /"), (case, where)
        # After the scratch folder's path, which differs per run.
        assert refusal in outcomes[case], (case, refusal, where)
    seeds = [c for c in outcomes if "/seed-" in c]
    assert len(seeds) >= 9 and all(outcomes[c] == "decoded" for c in seeds), where
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failures") and int(last.split()[0]) > 1000, where
