"""ddlrun: argument validation, the command it builds, real launches, the
rank agent on its own, and the ddlrun command's start without TensorFlow."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from keras_ddl_launcher import agent, ddlrun
from keras_ddl_launcher.deathwatch import DeathWatch

# Every rank prints its settings, then long lines flushed mid-line, all at once.
PROBE = """
import os, sys
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
print(f"RANK {rank} of {MPI.COMM_WORLD.Get_size()} "
      f"fusion={os.environ.get('DDL_FUSION_THRESHOLD_MB')} "
      f"algo={os.environ.get('DDL_ALLREDUCE')};", flush=True)
MPI.COMM_WORLD.Barrier()
for _ in range(int(sys.argv[2])):
    sys.stdout.write("xyz"[rank] * 3000)
    sys.stdout.flush()
    sys.stdout.write("xyz"[rank] * 3000 + "\\n")
    sys.stdout.flush()
sys.stderr.write(f"rank {rank} to stderr")  # no newline: ends as a line of its own
sys.exit(int(sys.argv[1]) if rank == 0 else 0)
"""
LONG_LINES = 100
# The ddlrun command's own module (what the console script runs).
DDLRUN = [sys.executable, "-m", "keras_ddl_launcher"]


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
    (["-np", "2", "--launcher-exec", "/nonexistent/ssh", "python"],
     "--launcher-exec /nonexistent/ssh: not an executable program"),
    (["-np", "2", "--launcher", "srun", "--launcher-exec", "ssh", "python"],
     "--launcher-exec applies to --launcher mpiexec only"),
    (["-np", "2", "--iface", "nosuchif0", "python"], "--iface nosuchif0: no network interface"),
    (["-np", "2", "--mpi-args", "-bind-to 'core", "python"], "--mpi-args"),
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
    hostfile.write_text("# cluster\nnode1:4\nnode2 slots=4  # Open MPI's form\n")
    assert ddlrun.main(["-np", "8", "--hostfile", str(hostfile), "--hierarchical",
                        "--fusion-threshold-mb", "32", "--bind-to-core", "--dry-run",
                        "--launcher-exec", "true", "--iface", "lo",
                        "--mpi-args", "-demux poll -verbose",
                        "python", str(train), "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert "DDL_ALLREDUCE=hierarchical" in out and "DDL_FUSION_THRESHOLD_MB=32.0" in out
    assert "-hosts node1:4,node2:4" in out and "-bind-to core" in out
    assert f"-launcher ssh -launcher-exec {shutil.which('true')} -iface lo -demux poll -verbose" \
        in out
    # each rank runs under its agent, which connects back to ddlrun
    assert f"{sys.executable} -I {agent.__file__} HOST:PORT -- python {train} --epochs 3" in out
    assert out.rstrip().endswith(f"python {train} --epochs 3")


def launch(tmp_path, options, rank0_exit):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    argv = DDLRUN + ["-np", "3", "--fusion-threshold-mb", "8", "--flat", *options,
                     sys.executable, str(probe), str(rank0_exit), str(LONG_LINES)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_launches_every_rank_with_prefixed_whole_lines(tmp_path):
    ok = launch(tmp_path, ["-l"], 0)
    assert ok.returncode == 0, ok.stderr
    settings, long_lines = [], {0: 0, 1: 0, 2: 0}
    for line in ok.stdout.splitlines():
        m = re.fullmatch(r"\[(\d)\] (.*)", line)
        assert m, f"not a whole prefixed line: {line[:100]!r}"
        rank, text = int(m.group(1)), m.group(2)
        if text.startswith("RANK"):
            settings.append(text)
        else:
            assert text == "xyz"[rank] * 6000, f"rank {rank}: {text[:50]!r}...{text[-50:]!r}"
            long_lines[rank] += 1
    assert sorted(settings) == [f"RANK {r} of 3 fusion=8.0 algo=flat;" for r in range(3)]
    assert long_lines == {0: LONG_LINES, 1: LONG_LINES, 2: LONG_LINES}
    assert sorted(line for line in ok.stderr.splitlines() if "to stderr" in line) == \
        [f"[{r}] rank {r} to stderr" for r in range(3)]


def test_exit_code_passes_and_the_failing_rank_is_named_without_prefixes(tmp_path):
    failed = launch(tmp_path, ["--no-prefix-output"], 3)
    assert failed.returncode == 3, (failed.returncode, failed.stderr[-2000:])
    lines = failed.stdout.splitlines()
    assert sorted(line for line in lines if line.startswith("RANK")) == \
        [f"RANK {r} of 3 fusion=8.0 algo=flat;" for r in range(3)]
    assert sorted(set(line for line in lines if not line.startswith("RANK"))) == \
        sorted("xyz"[r] * 6000 for r in range(3))
    assert re.search(r"^ddlrun: the job failed \(exit code 3\); rank 0 on \S+ ended first "
                     r"\(exit code 3\)", failed.stderr, re.MULTILINE), failed.stderr[-2000:]


def test_the_ddlrun_command_answers_help_without_tensorflow():
    script = os.path.join(os.path.dirname(sys.executable), "ddlrun")
    script = script if os.path.exists(script) else shutil.which("ddlrun")
    assert script, "the ddlrun command is not installed next to this Python"
    proc = subprocess.run([sys.executable, "-X", "importtime", script, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--launcher-exec PATH" in proc.stdout, proc.stderr[-2000:]
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert "keras_ddl_launcher.deathwatch" in imported  # the runner itself was loaded
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras")], \
        "ddlrun --help imported TensorFlow or Keras"
    # The same through the entry point's module, looking at sys.modules:
    # keras_ddl is not even imported (its __init__ would import TensorFlow).
    probe = ("import sys, keras_ddl_launcher.ddlrun; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('tensorflow', 'keras', 'keras_ddl', 'keras_ddl_launcher')))")
    listed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == str(["keras_ddl_launcher", "keras_ddl_launcher.agent",
                                         "keras_ddl_launcher.ddlrun",
                                         "keras_ddl_launcher.deathwatch",
                                         "keras_ddl_launcher.hosts",
                                         "keras_ddl_launcher.rank_output",
                                         "keras_ddl_launcher.settings",
                                         "keras_ddl_launcher.startup_lines"])


def watch_and_agent(command, token=None, rank="5"):
    """Runs agent.py (as ddlrun's launcher would) against a DeathWatch in
    this process; returns (agent's CompletedProcess, watch, relayed stdout)."""
    read_end, write_end = os.pipe()
    watch = DeathWatch("127.0.0.1", prefix_output=True, stdout_fd=write_end).start()
    env = dict(os.environ, PMI_RANK=rank, DDLRUN_TOKEN=token or watch.token)
    try:
        proc = subprocess.run([sys.executable, "-I", agent.__file__, watch.address, "--",
                               *command], capture_output=True, text=True, timeout=60, env=env)
    finally:
        watch.stop()
        os.close(write_end)
    with os.fdopen(read_end) as f:
        return proc, watch, f.read()


def test_agent_relays_output_and_dies_of_its_commands_signal():
    code = "import os, sys; print('hello'); sys.stdout.write('half'); sys.stdout.flush(); " \
           "os.kill(os.getpid(), 9)"
    proc, watch, relayed = watch_and_agent([sys.executable, "-c", code])
    assert proc.returncode == -9, proc.stderr  # the launcher sees what it would without the agent
    assert relayed == "[5] hello\n[5] half\n"
    assert [(d.rank, d.how) for d in watch.deaths] == [(5, "killed by SIGKILL")]
    assert watch.ranks == {5: __import__("socket").gethostname()}


def test_agent_with_a_wrong_token_is_ignored_and_its_rank_still_runs():
    proc, watch, relayed = watch_and_agent([sys.executable, "-c", "print('direct')"],
                                           token="not-the-token")
    assert proc.returncode == 0 and proc.stdout == "direct\n", proc.stderr
    assert relayed == "" and watch.deaths == [] and watch.ranks == {}


def test_agent_that_cannot_reach_ddlrun_runs_its_command_and_says_so():
    with __import__("socket").socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-I", agent.__file__, f"127.0.0.1:{port}", "--",
                           sys.executable, "-c", "import sys; print('ran'); sys.exit(4)"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PMI_RANK="2"))
    assert proc.returncode == 4 and proc.stdout == "ran\n"
    assert "rank 2" in proc.stderr and "cannot reach ddlrun at 127.0.0.1:" in proc.stderr


SIGNAL_PROBE = """
import os, signal, sys, time
from mpi4py import MPI
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(time.time()))
MPI.COMM_WORLD.Barrier()
print("ready", flush=True)
deadline = time.time() + 60
while time.time() < deadline and (not got or time.time() < got[0] + 1.0):
    time.sleep(0.05)  # after the first signal, a second has 1 s to arrive
print(f"signals {len(got)}", flush=True)
"""


def test_sigterm_to_ddlrun_reaches_every_rank_once(tmp_path):
    probe = tmp_path / "signals.py"
    probe.write_text(SIGNAL_PROBE)
    proc = subprocess.Popen(DDLRUN + ["-np", "2", "-l", sys.executable, str(probe)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    ready = [proc.stdout.readline() for _ in range(2)]
    assert sorted(ready) == ["[0] ready\n", "[1] ready\n"], (ready, proc.stderr.read())
    proc.terminate()  # ddlrun -> mpiexec -> every rank
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert sorted(out.splitlines()) == ["[0] signals 1", "[1] signals 1"], out + err
