"""Nothing hangs: a hung or killed rank, or a rank skipping a collective,
ends the job with an error that names the rank (and the tensor)."""

import os
import re
import time

from conftest import MPI_DIR, run_mpi

SCRIPT = os.path.join(MPI_DIR, "failures.py")


def launch(mode, env):
    start = time.time()
    proc = run_mpi(3, SCRIPT, args=[mode], env=env, timeout=240)
    return proc, time.time() - start


def errors(proc):
    return {int(m.group(1)): m.group(2) for m in
            re.finditer(r"^RANK (\d) ERROR (.*)$", proc.stdout, re.MULTILINE)}


def test_hung_rank_is_named_and_the_job_ends():
    proc, elapsed = launch("hang", {"DDL_PEER_TIMEOUT_S": "5"})
    assert proc.returncode != 0
    # Every live rank's engine reports the verdict on stderr as it fails the
    # pending ops (the first rank to exit then aborts the job, which can cut
    # the others' own Python output short, so that is checked on one rank).
    verdicts = set(re.findall(r"\[keras_ddl\] rank\(s\) \[1\] stopped responding.*"
                              r"\(rank (\d)\)", proc.stderr))
    assert verdicts == {"0", "2"}, proc.stdout[-3000:] + proc.stderr[-3000:]
    errs = errors(proc)
    assert errs and set(errs) <= {0, 2}, proc.stdout[-3000:]
    for message in errs.values():
        assert "AbortedError" in message and "rank(s) [1] stopped responding" in message
    # 5 s of silence plus at most 5 s of probing, after start-up
    times = [float(re.search(r"after ([\d.]+)s", m).group(1)) for m in errs.values()]
    assert max(times) < 60, times


def test_killed_rank_ends_the_job_non_zero():
    proc, elapsed = launch("kill", {"DDL_PEER_TIMEOUT_S": "5"})
    assert proc.returncode != 0
    assert "RANK 1 killed" in proc.stdout
    assert "stall not detected" not in proc.stdout


def test_skipped_collective_warns_then_fails_every_rank():
    proc, elapsed = launch("stall", {"DDL_STALL_WARNING_S": "1", "DDL_STALL_TIMEOUT_S": "4"})
    assert proc.returncode != 0
    warning = re.search(r"stall warning \(rank 0\).*?'skipped\.by\.rank1' waiting \d+ s for "
                        r"ranks \[1\]", proc.stderr, re.DOTALL)
    assert warning, proc.stderr[-3000:]
    errs = errors(proc)
    assert set(errs) == {0, 1, 2}, proc.stdout[-3000:]
    for message in errs.values():
        assert "DeadlineExceededError" in message and "stall timeout" in message
        assert "'skipped.by.rank1' missing on ranks [1]" in message
