"""The tools' help: `python -m keras_ddl_tools.bench ... --help` and
`python -m keras_ddl_tools.cluster ... --help` answer without importing
TensorFlow (so without its start-up logs), as `ddlrun --help` does. The
documented names, `python -m keras_ddl.bench` and `keras_ddl.cluster`, are
thin entry points inside keras_ddl, whose import loads TensorFlow; they give
the same help (tests/docs/test_layout.py runs them)."""

import subprocess
import sys

import pytest

from keras_ddl_tools.cluster.__main__ import build_parser


@pytest.mark.parametrize("argv", [
    ["-m", "keras_ddl_tools.bench", "--help"],
    ["-m", "keras_ddl_tools.bench", "fit", "--help"],
    ["-m", "keras_ddl_tools.bench", "allreduce", "-h"],
    ["-m", "keras_ddl_tools.bench", "syncbn", "--help"],
    ["-m", "keras_ddl_tools.cluster", "run", "--help"],
])
def test_help_without_tensorflow(argv):
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    documented = argv[1].replace("keras_ddl_tools", "keras_ddl")
    assert proc.stdout.startswith(f"usage: python -m {documented}"), proc.stdout[:300]
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert argv[1] in imported
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras", "keras_ddl")], \
        "the help imported keras_ddl, TensorFlow or Keras"
    others = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert others == [], others   # no start-up logs of any kind


def test_a_help_flag_meant_for_the_ranks_command_does_not_stop_the_tool():
    # `... cluster run -- python train.py --help` asks train.py for help: the
    # parser takes it as part of the command and does not exit.
    args = build_parser().parse_args(["run", "--", "python", "train.py", "--help"])
    assert args.command == ["--", "python", "train.py", "--help"]
