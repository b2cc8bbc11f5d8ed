"""Nothing hangs: a hung or killed rank, or a rank skipping a collective,
ends the job with an error that names the rank (and the tensor)."""

import re
import time

import pytest
from fault_reports import PHASES, fault_reports

SCRIPT = "failures.py"


def errors(proc):
    return {int(m.group(1)): m.group(2) for m in
            re.finditer(r"^RANK (\d) ERROR (.*)$", proc.stdout, re.MULTILINE)}


@pytest.mark.parametrize("mode, state", [("hang", "stopped"), ("vanish", "gone")])
def test_stopped_or_vanished_rank_is_diagnosed_by_every_live_rank(launcher, mode, state):
    # Rank 1 stops (SIGSTOP) or ends with exit code 0, which the launcher
    # does not act on. Every live rank, in whichever phase it noticed,
    # prints the same diagnosis naming rank 1, its host and what became of
    # it, then ends its process with exit code 70 (a Python error would
    # leave the failed collective's messages posted into freed memory).
    proc = launcher.mpi(3, SCRIPT, mode, env={"DDL_PEER_TIMEOUT_S": "5"}, timeout=240)
    assert proc.returncode != 0
    assert f"RANK 1 {'stopping' if mode == 'hang' else 'vanishing'}" in proc.stdout
    reports = fault_reports(proc.stderr)
    assert set(reports) == {0, 2}, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank, report in reports.items():
        assert report.phase in PHASES, report.text
        assert report.states == {1: state}, report.text
        assert f"rank 1 on {report.host} {state}:" in report.text  # one host: the same one
    assert not errors(proc), "a rank went on in Python after the failure: " + proc.stdout[-3000:]


@pytest.mark.parametrize("how", ["kill", "exit", "raise"])
def test_dead_rank_ends_the_job_and_ddlrun_names_it(launcher, how):
    # Through ddlrun: MPICH's launcher reports a dead rank by a PID only
    # (not always the first to die); ddlrun names the rank.
    proc = launcher.ddlrun(3, SCRIPT, how, options=["--no-prefix-output"],
                           env={"DDL_PEER_TIMEOUT_S": "5"}, timeout=240)
    ended = time.time()
    assert proc.returncode != 0
    died = re.search(rf"^RANK 1 dies \({how}\) at ([\d.]+)$", proc.stdout, re.MULTILINE)
    assert died, proc.stdout[-3000:]
    assert ended - float(died.group(1)) < 30
    assert "stall not detected" not in proc.stdout
    if how == "raise":
        # Python's exit shuts keras_ddl down on rank 1 and then waits in
        # MPI_Finalize: the other ranks' collectives fail and name it.
        errs = errors(proc)
        assert errs and set(errs) <= {0, 2}, proc.stdout[-3000:]
        for message in errs.values():
            assert "keras_ddl has been shut down on rank(s) [1]" in message, message
    else:
        assert re.search(r"^ddlrun: the job failed \(exit code \d+\); rank 1 on \S+ ended "
                         r"first", proc.stderr, re.MULTILINE), proc.stderr[-3000:]


def test_skipped_collective_warns_then_fails_every_rank(launcher):
    proc = launcher.mpi(3, SCRIPT, "stall",
                        env={"DDL_STALL_WARNING_S": "1", "DDL_STALL_TIMEOUT_S": "4"}, timeout=240)
    assert proc.returncode != 0
    warning = re.search(r"stall warning \(rank 0\).*?'skipped\.by\.rank1' waiting \d+ s for "
                        r"ranks \[1\]", proc.stderr, re.DOTALL)
    assert warning, proc.stderr[-3000:]
    errs = errors(proc)
    assert set(errs) == {0, 1, 2}, proc.stdout[-3000:]
    for message in errs.values():
        assert "DeadlineExceededError" in message and "stall timeout" in message
        assert "'skipped.by.rank1' missing on ranks [1]" in message
    # Waiting is not spinning: while the eager calls wait (each runs its
    # own negotiation rounds, a cycle apart), a rank uses a small share of
    # a core (measured 0.10-0.13 of one, 3 ranks on 2 cores).
    shares = {int(r): float(x) for r, x in re.findall(r"RANK (\d+) STALL_CPU ([\d.]+)",
                                                      proc.stdout)}
    assert set(shares) == {0, 1, 2}, proc.stdout[-3000:]
    assert max(shares.values()) < 0.5, shares
