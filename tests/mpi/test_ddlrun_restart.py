"""ddlrun --max-restarts: bad values are clear errors; a failed rank
relaunches the whole job (printing the cause) until it succeeds or N
restarts have failed; a signal to ddlrun stops the job without a restart.
Fast: the launched script uses mpi4py only (the TensorFlow restart case,
resumed from BackupAndRestore, is in test_resume_mpi.py)."""

import re
import signal
import subprocess
import sys

import pytest
from launching import output

from keras_ddl_launcher import ddlrun

PROBE = "restart_probe.py"
DDLRUN = [sys.executable, "-m", "keras_ddl_launcher"]


@pytest.mark.parametrize("argv, words", [
    (["--max-restarts", "-1"], "--max-restarts must be >= 0, got -1"),
    (["--max-restarts", "two"], "argument --max-restarts: invalid int value: 'two'"),
    (["--max-restarts", "1.5"], "argument --max-restarts: invalid int value: '1.5'"),
    (["--max-restarts", "2", "--restart-delay-s", "-1"],
     "--restart-delay-s must be in [0, 3600] seconds, got -1.0"),
    (["--max-restarts", "2", "--restart-delay-s", "nan"],
     "--restart-delay-s must be in [0, 3600] seconds, got nan"),
    (["--max-restarts", "2", "--restart-delay-s", "soon"],
     "argument --restart-delay-s: invalid float value: 'soon'"),
    (["--restart-delay-s", "5"], "--restart-delay-s applies with --max-restarts N (N >= 1) only"),
])
def test_bad_restart_options_are_clear_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ddlrun.main(["-np", "2", *argv, "python"])
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def restarting(launcher, tmp_path, nprocs, mode, max_restarts, timeout=120):
    return launcher.ddlrun(nprocs, PROBE, mode, str(tmp_path),
                           options=["--max-restarts", str(max_restarts),
                                    "--restart-delay-s", "0.5"],
                           timeout=timeout, cwd=tmp_path, module="keras_ddl_launcher")


def attempts(tmp_path):
    """{attempt: ranks that started in it}."""
    found = {}
    with open(tmp_path / "attempts") as f:
        for line in f:
            a, r = re.fullmatch(r"attempt=(\d+) rank=(\d+)\n", line).groups()
            found.setdefault(int(a), set()).add(int(r))
    return found


def test_a_failed_rank_restarts_the_job_with_its_cause_printed(launcher, tmp_path):
    proc = restarting(launcher, tmp_path, 3, "fail_first", 2)
    assert proc.returncode == 0, output(proc)
    assert attempts(tmp_path) == {0: {0, 1, 2}, 1: {0, 1, 2}}, output(proc)
    assert sorted(re.findall(r"^\[(\d)\] RANK \d done in attempt 1$", proc.stdout, re.M)) == \
        ["0", "1", "2"], output(proc)
    restart = re.search(r"^ddlrun: restart 1 of at most 2: attempt 1 failed \(exit code \d+\); "
                        r"rank 2 on \S+ ended first \(exit code 3\), [\d.]+ s after launch; "
                        r"rank 2 diagnosed: \[keras_ddl\] probe diagnosis of attempt 0\. "
                        r"Time lost: [\d.]+ s", proc.stderr, re.M)
    assert restart, output(proc)
    assert re.search(r"^ddlrun: the job succeeded after 1 restart\(s\)", proc.stderr, re.M), \
        output(proc)


def test_gives_up_after_max_restarts_with_the_failure_exit(launcher, tmp_path):
    proc = restarting(launcher, tmp_path, 2, "always_fail", 2)
    assert proc.returncode != 0, output(proc)
    assert attempts(tmp_path) == {0: {0, 1}, 1: {0, 1}, 2: {0, 1}}, output(proc)
    assert len(re.findall(r"^ddlrun: restart \d of at most 2: attempt \d failed .*rank 1 on "
                          r"\S+ ended first \(killed by SIGKILL\)", proc.stderr, re.M)) == 2, \
        output(proc)
    assert re.search(r"^ddlrun: the job failed \(exit code \d+\); rank 1 on \S+ ended first "
                     r"\(killed by SIGKILL\).*Giving up: 2 restart\(s\) done, --max-restarts 2",
                     proc.stderr, re.M), output(proc)


@pytest.mark.parametrize("signum, elastic", [(signal.SIGTERM, False), (signal.SIGINT, False),
                                             (signal.SIGTERM, True)])
def test_a_signal_to_ddlrun_stops_the_job_without_a_restart(launcher, tmp_path, signum, elastic):
    # Elastic: the ranks that end with the signal blame no host either.
    hosts = ["-H", "localhost:2", "--min-np", "1"] if elastic else []
    argv = DDLRUN + ["-np", "2", "--max-restarts", "3", "--restart-delay-s", "0.5", *hosts,
                     *launcher.python(PROBE, "wait", str(tmp_path))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=launcher.env(), cwd=tmp_path)
    ready = [proc.stdout.readline() for _ in range(2)]
    assert sorted(ready) == ["[0] RANK 0 READY\n", "[1] RANK 1 READY\n"], ready
    proc.send_signal(signum)  # as Slurm (SIGTERM) or a Ctrl-C from another terminal (SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, out + err
    assert attempts(tmp_path) == {0: {0, 1}}, out + err
    assert "restart 1" not in err and "left out" not in err, err
    assert f"ddlrun: {signum.name} received: the job was stopped, not restarted" in err, err
