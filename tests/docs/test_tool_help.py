"""`python -m keras_ddl.bench ... --help` and `python -m keras_ddl.cluster
... --help` answer without importing TensorFlow (so without its start-up
logs), as `ddlrun --help` does; any other run of keras_ddl is unaffected."""

import subprocess
import sys

import pytest

from keras_ddl import _tool_help
from keras_ddl_tools.cluster.__main__ import build_parser


@pytest.mark.parametrize("argv", [
    ["-m", "keras_ddl.bench", "--help"],
    ["-m", "keras_ddl.bench", "fit", "--help"],
    ["-m", "keras_ddl.bench", "allreduce", "-h"],
    ["-m", "keras_ddl.cluster", "run", "--help"],
])
def test_help_without_tensorflow(argv):
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: python -m {argv[1]}"), proc.stdout[:300]
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert "keras_ddl._tool_help" in imported
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras")], \
        "the help imported TensorFlow or Keras"
    others = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert others == [], others   # no start-up logs of any kind


@pytest.mark.parametrize("orig_argv,expected", [
    (["python", "-m", "keras_ddl.bench", "--help"], ("keras_ddl.bench", ["--help"])),
    (["python", "-u", "-mkeras_ddl.cluster", "-h"], ("keras_ddl.cluster", ["-h"])),
    (["python", "-X", "importtime", "-W", "error", "-m", "keras_ddl.bench", "-h"],
     ("keras_ddl.bench", ["-h"])),
    (["python", "-m", "keras_ddl.bench", "fit"], None),                  # no help asked
    (["python", "-m", "keras_ddl.runner.ddlrun", "--help"], None),       # not one of these tools
    (["python", "train.py", "-m", "keras_ddl.bench", "--help"], None),   # a script's arguments
    (["python", "-c", "pass", "-m", "keras_ddl.bench", "-h"], None),
])
def test_requested_tool(orig_argv, expected):
    assert _tool_help.requested_tool(orig_argv) == expected


def test_a_help_flag_meant_for_the_ranks_command_does_not_stop_the_tool():
    # `... cluster run -- python train.py --help` asks train.py for help: the
    # parser takes it as part of the command, does not exit, and the package
    # then loads as usual.
    args = build_parser().parse_args(["run", "--", "python", "train.py", "--help"])
    assert args.command == ["--", "python", "train.py", "--help"]
