"""ddlrun: argument validation, the command it builds, and a real launch."""

import os
import re
import subprocess
import sys

import pytest

from keras_ddl.runner import ddlrun

PROBE = """
import os, sys
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
sys.stdout.write(f"RANK {rank} of {MPI.COMM_WORLD.Get_size()} "
                 f"fusion={os.environ.get('DDL_FUSION_THRESHOLD_MB')} "
                 f"algo={os.environ.get('DDL_ALLREDUCE')};\\n")  # one write: ranks share stdout
sys.stdout.flush()
sys.exit(int(sys.argv[1]) if rank == 0 else 0)
"""


@pytest.mark.parametrize("argv, words", [
    (["-np", "0", "python", "x.py"], "-np must be >= 1"),
    (["-np", "2"], "no command"),
    (["-np", "2", "--fusion-threshold-mb", "-3", "python"], "--fusion-threshold-mb"),
    (["-np", "2", "--cycle-time-ms", "0", "python"], "--cycle-time-ms"),
    (["-np", "3", "--local-size", "2", "python"], "--local-size 2 must be >= 1 and divide -np 3"),
    (["-np", "2", "-H", "a:0", "python"], "'a:0' is not host or host:slots"),
    (["-np", "9", "-H", "a:4,b:4", "python"], "exceeds the 8 slots"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "python"], "--hostfile /nonexistent/hosts"),
    (["-np", "2", "--timeline", "/nonexistent/dir/t.json", "python"], "--timeline"),
    (["-np", "2", "--stall-timeout-s", "-1", "python"], "--stall-timeout-s"),
    (["-np", "2", "--flat", "--hierarchical", "python"], "not allowed with"),
    (["-np", "2", "python", "/nonexistent/train.py"], "script '/nonexistent/train.py' does not exist"),
    (["-np", "2", "no-such-program-xyz"], "program 'no-such-program-xyz' not found"),
])
def test_bad_arguments_are_clear_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ddlrun.main(argv)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_dry_run_sets_environment_and_hosts(capsys, tmp_path):
    train = tmp_path / "train.py"
    train.write_text("")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1:4\nnode2:4 extra-ignored\n")
    assert ddlrun.main(["-np", "8", "--hostfile", str(hostfile), "--hierarchical",
                        "--fusion-threshold-mb", "32", "--bind-to-core", "--dry-run",
                        "python", str(train), "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert "DDL_ALLREDUCE=hierarchical" in out and "DDL_FUSION_THRESHOLD_MB=32.0" in out
    assert "-hosts node1:4,node2:4" in out and "-bind-to core" in out
    assert out.rstrip().endswith(f"python {train} --epochs 3")


def test_launches_every_rank_with_the_environment_and_passes_exit_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    base = [sys.executable, "-m", "keras_ddl.runner.ddlrun", "-np", "3",
            "--fusion-threshold-mb", "8", "--flat", sys.executable, str(probe)]
    ok = subprocess.run(base + ["0"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    lines = sorted(re.findall(r"RANK \d of \d+ fusion=\S+ algo=\w+;", ok.stdout))
    assert lines == [f"RANK {r} of 3 fusion=8.0 algo=flat;" for r in range(3)]
    failed = subprocess.run(base + ["3"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert failed.returncode == 3, (failed.returncode, failed.stderr[-2000:])
