"""python -m keras_ddl.cluster run: the ranks use the interpreter that runs
the command (a bare python/python3 is replaced, also under sudo), and --help
says so. The namespaces themselves are faked: this is about the command line."""

import subprocess
import sys

import pytest

from keras_ddl_tools.cluster import __main__ as cluster_command


@pytest.mark.parametrize("command,expected", [
    (["python", "train.py", "--epochs", "1"], [sys.executable, "train.py", "--epochs", "1"]),
    (["python3", "-u", "x.py"], [sys.executable, "-u", "x.py"]),
    (["/usr/bin/python3", "x.py"], ["/usr/bin/python3", "x.py"]),   # a path is the user's choice
    (["python3.11", "x.py"], ["python3.11", "x.py"]),               # only the bare names
    (["hostname"], ["hostname"]),
    ([], []),
])
def test_bare_python_becomes_this_interpreter(command, expected):
    assert cluster_command.with_this_interpreter(command) == expected


class FakeCluster:
    hosts = ["node0", "node1"]
    nodes = 2

    def __init__(self, nodes, rate, burst=None, racks=1, uplink=None, tell_topology=True,
                 shm=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def mpiexec_args(self, ranks_per_node):
        return ["-hosts", "node0:1,node1:1"]

    def link_bytes(self):
        return [(0, 0), (0, 0)]

    def uplink_bytes(self):
        return []  # one rack: no uplinks


def test_run_launches_ranks_with_this_interpreter(monkeypatch, capsys):
    launched = []
    monkeypatch.setattr(cluster_command, "NetnsCluster", FakeCluster)
    monkeypatch.setattr(cluster_command, "find_mpiexec", lambda: "/x/mpiexec")
    monkeypatch.setattr(cluster_command.subprocess, "run",
                        lambda argv, env: launched.append(argv) or
                        subprocess.CompletedProcess(argv, 0))
    assert cluster_command.main(["run", "--nodes", "2", "--", "python", "train.py"]) == 0
    assert launched == [["/x/mpiexec", "-hosts", "node0:1,node1:1", "-n", "2",
                         sys.executable, "train.py"]]


def test_run_help_says_which_python_runs():
    proc = subprocess.run([sys.executable, "-m", "keras_ddl.cluster", "run", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "a bare 'python' or 'python3'" in text and sys.executable in text
    assert "sudo" in text
