"""A real Slurm (Debian's 22.05: slurmctld, slurmd, munge) on the namespace
test cluster, 2 racks x 2 nodes, one task per node, with Slurm's
topology/tree plugin written from the racks (keras_ddl_tools/cluster/slurm.py).
One cluster for the module; three launches of tests/mpi/scripts/slurm_job.py, each
checking that the world is Slurm's 4 tasks on the allocation's nodes, that
every rank reads its rack from Slurm's SLURM_TOPOLOGY_ADDR, and that the
rack allreduce runs, bitwise in rack order:

- ``srun --mpi=pmi2`` directly, with the default mpich wheel;
- ``ddlrun --launcher srun`` inside ``salloc`` (ddlrun adds ``--mpi=pmi2``);
- the batch script of docs/multinode.md, as written, through ``sbatch``,
  waited for (scontrol polled), its output file read. The script asks for
  2 nodes of 4 tasks; these nodes have one CPU each, so sbatch's command
  line asks for 4 nodes of 1 (command-line options override the script's
  ``#SBATCH`` lines; the script itself runs unchanged).

A bare ``srun`` (this Slurm's ``MpiDefault`` is none) starts 4 tasks that
MPI cannot join: ``init()`` ends every one of them, naming the fix, before
any training.

Then one batch job with ``--requeue`` (docs/failures.md's recipe, without
ddlrun's own restarts): node4 is lost mid-epoch (cut off, everything on it
killed), the script hands the job back, Slurm runs it again once the node
is back (the test releases Slurm's 2-minute hold on requeued jobs), and it
resumes from the mid-epoch backup bitwise equal to the same fit without a
fault; in that second run ``scancel`` stops every process of the job with
the backups intact.

What works, and why (found here):

- ``--mpi=pmi2`` works through keras_ddl's PMI relay. MPICH speaks PMI-1
  to Slurm's pmi2 plugin, which takes each request from a single read of at
  most 1024 bytes. At MPI_Init MPICH publishes a fixed 4096-byte card for
  its UCX address, bytes past the address included, hex-encoded with runs
  compressed, in values of up to the 1024 characters Slurm allows; after
  ``import tensorflow`` those bytes are docstrings, nothing compresses, and
  a request of about 1077 bytes is cut in two: the truncated address makes
  UCX fail ("failed to unpack address, invalid bandwidth 0.00"). The relay
  (src/keras_ddl/common/slurm_pmi.py, started by ``import keras_ddl``) lowers
  the vallen_max Slurm announces so every request fits;
  ``pmi_went_through_the_relay`` checks it ran.
- ``--mpi=pmix`` does not work with the mpich wheel. Debian's Slurm lists
  it, but its plugin loads the PMIx library by its unversioned name
  (.../pmix2/lib/libpmix.so, in the package libpmix-dev, which slurmd does
  not depend on) and makes per-step directories in /tmp, whose names collide
  between nodes sharing one /tmp (as this cluster's nodes do). With a /tmp
  per node and libpmix-dev, srun starts the step, and
  the wheel's MPI_Init fails: by default it looks for a PMI-1 socket, and
  with ``MPIR_CVAR_PMI_VERSION=x`` it stops with "Internal MPI error" in
  MPIR_pmi_init (the wheel has no PMIx client). Not tested here.
- ``MPIR_CVAR_PMI_VERSION=2`` (PMI-2's length-prefixed messages, which
  Slurm reads whole) is refused by the mpich wheel at MPI_Init.

Skips, naming the reason, only without root, ip/tc, or Slurm's and munge's
programs.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types

import pytest

from launching import SCRIPTS_DIR, TESTS_DIR, Launcher, case_names

JOB = os.path.join(SCRIPTS_DIR, "slurm_job.py")
CASES = case_names("slurm_job.py")
DOCS = os.path.join(os.path.dirname(TESTS_DIR), "docs", "multinode.md")
LAUNCH_TIMEOUT_S = 240
_RUNS = {}


@pytest.fixture(scope="module")
def slurm_cluster():
    from keras_ddl_tools.cluster import NetnsCluster, missing_requirements, missing_slurm
    reason = missing_requirements() or missing_slurm()
    if reason:
        pytest.skip(f"a Slurm on the namespace test cluster cannot run here: {reason}")
    with NetnsCluster(2, "1gbit", racks=2, slurm=True, slurm_cpus=1) as cluster:
        yield cluster
    _RUNS.clear()


def slurm_env(cluster, extra=None):
    """The launch environment (quiet TensorFlow, a stall timeout) with this
    cluster's SLURM_CONF, the venv's programs first on PATH (ddlrun,
    python), and the tests' harness importable."""
    env = Launcher.env(cluster.slurm.env())
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = SCRIPTS_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def run(argv, env, cwd=TESTS_DIR):
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        def text(data):
            return (data or b"").decode(errors="replace") if isinstance(data, bytes) else data
        pytest.fail(f"{' '.join(argv)} did not finish in {LAUNCH_TIMEOUT_S} s\n"
                    f"stdout:\n{text(e.stdout)[-4000:]}\nstderr:\n{text(e.stderr)[-4000:]}")


# Where a batch job has ended (JobState in scontrol's answer).
ENDED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def wait_for_job(cluster, job_id):
    """Waits for batch job ``job_id`` to end, polling scontrol twice a
    second (``sbatch --wait`` polls every few seconds, up to 20 s late
    here); a CompletedProcess whose returncode is the script's exit code."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while time.monotonic() < deadline:
        out = cluster.slurm.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
        if fields.get("JobState") in ENDED_STATES:
            code = int(fields.get("ExitCode", "1:0").split(":")[0])
            return subprocess.CompletedProcess(["sbatch"], code, out, "")
        time.sleep(0.5)
    pytest.fail(f"batch job {job_id} still running after {LAUNCH_TIMEOUT_S} s:\n{out}")


def docs_batch_script():
    """The batch script of docs/multinode.md (its ``#SBATCH`` block)."""
    with open(DOCS) as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "#SBATCH" in b]
    assert len(blocks) == 1, f"expected one #SBATCH script in {DOCS}, found {len(blocks)}"
    return blocks[0]


def launch(cluster, how):
    """One launch of slurm_job.py: (CompletedProcess, text holding its
    DDLCASE lines), shared by the tests of that launch."""
    if how in _RUNS:
        return _RUNS[how]
    env = slurm_env(cluster)
    python = sys.executable
    if how == "srun":
        proc = run(["srun", "-N", "4", "-n", "4", "--mpi=pmi2", python, JOB], env)
        output = proc.stdout
    elif how == "salloc":
        # The ddlrun command users type (it starts without TensorFlow).
        ddlrun = os.path.join(os.path.dirname(python), "ddlrun")
        proc = run(["salloc", "-N", "4", "--ntasks-per-node=1", ddlrun, "-np", "4",
                    "--launcher", "srun", python, JOB], env)
        output = proc.stdout
    else:  # the docs' batch script, as written, with train.py this job
        # The job's directory is one the nodes share, as a home directory on
        # a cluster's shared file system.
        work = tempfile.mkdtemp(prefix="sbatch-", dir=cluster.slurm.directory)
        try:
            shutil.copy(JOB, os.path.join(work, "train.py"))
            with open(os.path.join(work, "train.sbatch"), "w") as f:
                f.write(docs_batch_script())
            # The docs' script asks for 2 nodes of 4 tasks; this cluster's
            # nodes have one CPU each, so the same script runs on 4 nodes of
            # one task: sbatch's options on the command line override the
            # script's, the script's lines stay as written.
            proc = run(["sbatch", "--nodes=4", "--ntasks-per-node=1", "train.sbatch"], env,
                       cwd=work)
            job = re.search(r"Submitted batch job (\d+)", proc.stdout)
            assert job, proc.stdout + proc.stderr
            proc = wait_for_job(cluster, job.group(1))
            out_file = os.path.join(work, f"train-{job.group(1)}.out")
            assert os.path.exists(out_file), (os.listdir(work), proc.stderr)
            with open(out_file, errors="replace") as f:
                output = f.read()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _RUNS[how] = (proc, output)
    return _RUNS[how]


HOW = ["srun", "salloc", "sbatch"]


@pytest.mark.parametrize("how", HOW)
def test_launch_exits_zero(slurm_cluster, how):
    proc, output = launch(slurm_cluster, how)
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout:\n{output[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("how", HOW)
def test_slurm_job_cases(slurm_cluster, how, name):
    proc, output = launch(slurm_cluster, how)
    results = Launcher.parse_cases(types.SimpleNamespace(stdout=output))
    per_rank = results.get(name)
    assert per_rank is not None, \
        f"case {name} reported nothing under {how}:\n{output[-3000:]}\n{proc.stderr[-3000:]}"
    assert sorted(per_rank) == [0, 1, 2, 3], per_rank
    failures = [f"rank {r}: {res['detail']}" for r, res in sorted(per_rank.items())
                if not res["ok"]]
    assert not failures, "\n".join(failures)


def test_bare_srun_is_refused_on_every_task_before_training(slurm_cluster):
    # This Slurm's MpiDefault is none: a bare srun starts 4 tasks that MPI
    # cannot join, each a world of 1. init() must end every one of them.
    program = ("from keras_ddl.common import basics; basics.init(); "
               "print('TRAINED ALONE', flush=True)")
    proc = run(["srun", "-l", "-N", "4", "-n", "4", sys.executable, "-c", program],
               slurm_env(slurm_cluster))
    said = (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
            f"stderr:\n{proc.stderr[-6000:]}")
    assert proc.returncode != 0 and "TRAINED ALONE" not in proc.stdout, said
    for task in range(4):
        lines = "\n".join(line for line in proc.stderr.splitlines()
                          if re.match(rf"\s*{task}: ", line))
        for part in ("LauncherMismatchError", "SLURM_STEP_NUM_TASKS=4 says srun started 4 tasks",
                     f"SLURM_PROCID={task}", "each task would train alone", "srun --mpi=pmi2",
                     "MpiDefault=pmi2 in slurm.conf"):
            assert part in lines, (task, part, said)


def test_ddlrun_adds_the_pmi_plugin_unless_told():
    from keras_ddl_launcher.ddlrun import srun_pmi_option
    assert srun_pmi_option([], environ={}) == ["--mpi=pmi2"]
    assert srun_pmi_option(["--mpi=pmix"], environ={}) == []
    assert srun_pmi_option(["--mpi", "pmix"], environ={}) == []
    assert srun_pmi_option([], environ={"SLURM_MPI_TYPE": "pmix"}) == []


def test_relay_lowers_only_the_value_length():
    from keras_ddl.common import slurm_pmi
    maxes = b"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n"
    lowered = slurm_pmi.rewrite_maxes(maxes)
    assert lowered == (b"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max="
                       + str(slurm_pmi.SAFE_VALLEN).encode() + b"\n")
    # The longest request MPICH then sends fits in Slurm's one read.
    longest = (b"cmd=put kvsname=4294967294.4294967294 key=" + b"k" * 64 + b" value="
               + b"F" * slurm_pmi.SAFE_VALLEN + b"\n")
    assert len(longest) <= slurm_pmi.SLURM_PMI1_READ, len(longest)
    for line in (b"cmd=maxes rc=0 vallen_max=512\n", b"cmd=get_result rc=0 value=vallen_max\n"):
        assert slurm_pmi.rewrite_maxes(line) == line


def test_no_daemon_outlives_the_cluster():
    from keras_ddl_tools.cluster import NetnsCluster, missing_requirements, missing_slurm
    reason = missing_requirements() or missing_slurm()
    if reason:
        pytest.skip(f"a Slurm on the namespace test cluster cannot run here: {reason}")
    cluster = NetnsCluster(1, "1gbit", slurm=True, slurm_cpus=1).up()
    try:
        pids = [proc.pid for _, proc in cluster.slurm._daemons]
        states = cluster.slurm.node_states()
        assert states == {"node1": "idle"}, states
        conf = cluster.slurm.conf
    finally:
        cluster.down()
    alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")
             and open(f"/proc/{pid}/stat").read().split()[2] != "Z"]
    assert not alive, f"daemons left running: {alive}"
    assert not os.path.exists(conf), conf


def test_cluster_run_slurm_runs_the_client_command_with_slurm_conf(monkeypatch):
    from keras_ddl_tools.cluster import __main__ as cluster_command
    made, launched = [], []

    class FakeSlurm:
        def env(self):
            return {"SLURM_CONF": "/x/slurm.conf"}
        conf = "/x/slurm.conf"

    class FakeCluster:
        hosts = ["node1", "node2"]
        nodes = 2
        slurm = FakeSlurm()

        def __init__(self, *args, **kwargs):
            made.append(kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def link_bytes(self):
            return [(0, 0), (0, 0)]

        def uplink_bytes(self):
            return []

    monkeypatch.setattr(cluster_command, "NetnsCluster", FakeCluster)
    monkeypatch.setattr(cluster_command.subprocess, "run",
                        lambda argv, env: launched.append((argv, env["SLURM_CONF"])) or
                        subprocess.CompletedProcess(argv, 3))
    code = cluster_command.main(["run", "--slurm", "--ranks-per-node", "2", "--",
                                 "srun", "--mpi=pmi2", "hostname"])
    assert code == 3  # the client's exit code
    assert made[0]["slurm"] is True and made[0]["slurm_cpus"] == 2, made
    # The command is Slurm's client, run as given (no mpiexec around it).
    assert launched == [(["srun", "--mpi=pmi2", "hostname"], "/x/slurm.conf")], launched


def relay_between(client_first_bytes):
    """A relay started as under srun (its PMI socket's other end held here
    as "Slurm"); returns (slurm socket, client fd, relay process)."""
    import socket

    from keras_ddl.common import slurm_pmi
    slurm_side, task_side = socket.socketpair()
    environ = {"SLURM_MPI_TYPE": "pmi2", "PMI_FD": str(os.dup(task_side.fileno())),
               "PATH": os.environ.get("PATH", "")}
    task_side.close()
    os.set_inheritable(int(environ["PMI_FD"]), True)
    # This pytest process may have imported mpi4py's MPI for another test;
    # the socket here is not MPI's, so the relay is wanted all the same.
    proc = slurm_pmi.start_relay(environ, mpi_started=False)
    assert proc is not None and environ["DDL_PMI_RELAY_ACTIVE"] == "1"
    client = int(environ["PMI_FD"])
    os.write(client, client_first_bytes)
    slurm_side.settimeout(20)
    return slurm_side, client, proc


def test_relay_passes_whole_pmi1_lines_and_lowers_vallen_max():
    from keras_ddl.common import slurm_pmi
    slurm, client, proc = relay_between(b"cmd=init pmi_version=1 pmi_")
    try:
        # A request written in two pieces reaches Slurm as one whole line.
        os.write(client, b"subversion=1\n")
        assert slurm.recv(1024) == b"cmd=init pmi_version=1 pmi_subversion=1\n"
        slurm.sendall(b"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n")
        assert os.read(client, 1024) == b"cmd=response_to_init rc=0 pmi_version=1 " \
                                        b"pmi_subversion=1\n"
        os.write(client, b"cmd=get_maxes\n")
        assert slurm.recv(1024) == b"cmd=get_maxes\n"
        slurm.sendall(b"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n")
        answer = os.read(client, 1024)
        assert answer == (b"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max="
                          + str(slurm_pmi.SAFE_VALLEN).encode() + b"\n"), answer
    finally:
        os.close(client)
        assert proc.wait(timeout=20) == 0  # the task's end closed: the relay ends
        slurm.close()


def test_relay_passes_pmi2_messages_untouched():
    # PMI-2's messages are length-prefixed, without newlines: bytes pass as they are.
    message = b"000044cmd=fullinit;pmijobid=1.0;pmirank=0;threaded=FALSE;"
    slurm, client, proc = relay_between(message)
    try:
        got = b""
        while len(got) < len(message):
            got += slurm.recv(1024)
        assert got == message
        reply = b"000050cmd=fullinit-response;rc=0;vallen_max=1024;"
        slurm.sendall(reply)
        assert os.read(client, 1024) == reply
    finally:
        os.close(client)
        assert proc.wait(timeout=20) == 0
        slurm.close()


# docs/failures.md's recipe without ddlrun's own restarts, so that losing a
# node reaches Slurm: the job hands itself back and Slurm runs it again.
# The plan (tests/mpi/scripts/resume_job.py): A holds at global batch 8 in the first
# run (its backup of batch 5, mid-epoch, on disk) and resumes in the second;
# REF is the same fit without a fault; C waits at batch 8 for the scancel.
REQUEUE_SCRIPT = """#!/bin/bash
#SBATCH --requeue --output=train-%j.out
ddlrun -np $SLURM_NTASKS --launcher srun python train.py {work} arrays:A:hold=8+arrays:REF+arrays:C:wait=8
code=$?
if [ $code -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt 1 ]; then
    scontrol requeue $SLURM_JOB_ID
fi
exit $code
"""


def wait_until(what, ready, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"{what}: not after {timeout} s")


def job_fields(cluster, job_id):
    out = cluster.slurm.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def leftover_processes(cluster):
    """What still runs in the nodes besides slurmd: {node: [command]}."""
    left = {}
    for node, host in enumerate(cluster.hosts):
        for pid in cluster.processes(node):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{pid}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                continue
            if not zombie and not argv[0].endswith(b"slurmd"):
                left.setdefault(host, []).append(b" ".join(argv).decode(errors="replace"))
    return left


def requeue_run(cluster):
    """Loses node4 while the job holds, lets Slurm requeue it, then cancels
    the second run while C waits. Returns what the tests check."""
    if "requeue" in _RUNS:
        return _RUNS["requeue"]
    work = tempfile.mkdtemp(prefix="requeue-", dir=cluster.slurm.directory)
    shutil.copy(os.path.join(SCRIPTS_DIR, "resume_job.py"), os.path.join(work, "train.py"))
    with open(os.path.join(work, "requeue.sbatch"), "w") as f:
        f.write(REQUEUE_SCRIPT.format(work=work))
    # The ranks left give up on node4's within 5 s (default 15 s).
    env = slurm_env(cluster, {"DDL_PEER_TIMEOUT_S": "5"})
    proc = run(["sbatch", "--parsable", "--nodes=4", "--ntasks-per-node=1", "requeue.sbatch"],
               env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    output = os.path.join(work, f"train-{job}.out")

    def text():
        try:
            with open(output, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    wait_until("the first run holding at batch 8",
               lambda: os.path.exists(os.path.join(work, "A.holding")), LAUNCH_TIMEOUT_S)
    # node4 is lost: cut off, everything on it killed (its slurmd too).
    cluster.set_link(3, False)
    cluster.kill_processes(3)
    wait_until("Slurm requeueing the job",
               lambda: job_fields(cluster, job).get("Restarts") == "1", 120)
    # The node comes back; Slurm holds a requeued job about 2 minutes
    # (Reason=BeginTime): released at once here.
    cluster.set_link(3, True)
    cluster.slurm.start_slurmd(3)
    wait_until("node4 back in service", lambda: cluster.slurm.node_states().get("node4")
               == "idle", 60)
    # Released only once pending: while the job still completes, Slurm sets
    # the 2-minute hold again when it puts the job back in the queue.
    wait_until("the job pending again", lambda: job_fields(cluster, job).get("JobState")
               == "PENDING", 60)
    cluster.slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    wait_until("the second run waiting in C",
               lambda: os.path.exists(os.path.join(work, "C.holding")), LAUNCH_TIMEOUT_S)
    cancelled_at = time.monotonic()
    cluster.slurm.run("scancel", job)
    state = wait_until("the job cancelled", lambda: job_fields(cluster, job).get("JobState")
                       in ENDED_STATES and job_fields(cluster, job)["JobState"], 60)
    stop_seconds = time.monotonic() - cancelled_at
    deadline = time.monotonic() + 30  # slurmstepd reaps the steps after the job ends
    left = leftover_processes(cluster)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = leftover_processes(cluster)
    from keras_ddl.keras import backup_store
    backups = {}
    for name in sorted(os.listdir(os.path.join(work, "C"))):
        path = os.path.join(work, "C", name)
        try:
            meta = backup_store.read_meta(path)
            backup_store.verify(path, meta)
            backups[name] = "intact"
        except Exception as e:  # noqa: BLE001 - reported by the test
            backups[name] = repr(e)
    _RUNS["requeue"] = {"output": text(), "state": state, "stop_seconds": stop_seconds,
                        "left": left, "backups": backups}
    return _RUNS["requeue"]


def job_lines(output, job, what):
    """{rank: [rest of line]} of 'RANK r JOB job WHAT ...' lines, in order."""
    lines = {}
    for m in re.finditer(rf"RANK (\d+) JOB {job} {what} (.*)", output):
        lines.setdefault(int(m.group(1)), []).append(m.group(2).strip())
    return lines


def test_requeued_job_resumes_from_the_mid_epoch_backup_bitwise(slurm_cluster):
    result = requeue_run(slurm_cluster)
    output = result["output"]
    restored = job_lines(output, "A", "RESTORED")
    assert sorted(restored) == [0, 1, 2, 3], output[-3000:]
    for rank, lines in restored.items():
        # The output file holds the second run only (Slurm truncates it when
        # the job runs again): restored from the backup of batch 5 (epoch 0,
        # step 5: mid-epoch) on the same 4 ranks.
        assert lines == ["epoch=0 step=5 iterations=5 world=4"], (rank, lines)
    resumed = job_lines(output, "A", "FINAL")
    fresh = job_lines(output, "REF", "FINAL")
    assert sorted(resumed) == sorted(fresh) == [0, 1, 2, 3], output[-3000:]
    digests = {lines[-1] for lines in resumed.values()}
    assert len(digests) == 1, resumed
    assert digests == {lines[-1] for lines in fresh.values()}, (resumed, fresh)


def test_scancel_stops_every_process_with_backups_intact(slurm_cluster):
    result = requeue_run(slurm_cluster)
    assert result["state"] == "CANCELLED", result
    # SIGTERM, then SIGKILL after KillWait=5 s: well within 30 s.
    assert result["stop_seconds"] < 30, result
    assert result["left"] == {}, result
    assert result["backups"] and set(result["backups"].values()) == {"intact"}, result
