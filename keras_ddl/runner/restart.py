"""ddlrun --max-restarts N: run the job again, on the same hosts with the
same size, when a rank fails; the script resumes from its BackupAndRestore
directory (keras_ddl.callbacks.BackupAndRestore), so a restarted job ends
with the weights an uninterrupted one would have.

One attempt is one launch of the whole job. When a rank ends other than
with exit code 0, the MPI launcher ends the others (and if it has not after
``END_GRACE_S``, ddlrun does: Slurm's srun, for one, lets the other tasks
run on). ddlrun prints why the attempt failed (the rank that ended first,
its host, its exit code or signal, and the last keras_ddl diagnosis line a
rank printed), waits ``--restart-delay-s``, and launches again, at most N
times; then it gives up with the last attempt's exit code.

A signal to ddlrun (Ctrl-C, or the SIGTERM Slurm sends at the end of a job
or on preemption) is the user's or the scheduler's decision, not a fault:
it is forwarded to the job and no attempt follows, even one already
waiting to start. Every attempt's ranks see ``DDLRUN_RESTART_COUNT``
(0 for the first launch), as torchrun's TORCHELASTIC_RESTART_COUNT.

Imported only when --max-restarts is given: ``ddlrun --help`` loads as
little as it can.
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time

from .agent import STDERR, TOKEN_VARIABLE, describe_status
from .deathwatch import DeathWatch

RESTART_VARIABLE = "DDLRUN_RESTART_COUNT"
DIAGNOSIS_MARK = "[keras_ddl]"
# After a rank failed, how long the launcher has to end the others itself.
# A dead rank ends the job within 30 s (docs/failures.md): the ranks' own
# diagnosis takes DDL_PEER_TIMEOUT_S plus a few seconds.
END_GRACE_S = 30.0
# After SIGTERM, how long the launcher has before SIGKILL.
KILL_GRACE_S = 10.0
POLL_S = 0.25  # how often ddlrun looks at the launcher while it runs

Attempt = collections.namedtuple(
    "Attempt", "code started ended failure failed_at diagnosis stopped_by")


class _WholeLines:
    """Cuts one byte stream into whole lines: a line cut between two reads
    waits for its end (at most 64 KB of it)."""

    def __init__(self):
        self.pending = b""

    def feed(self, data):
        self.pending += data
        cut = self.pending.rfind(b"\n") + 1
        if cut == 0 and len(self.pending) >= 65536:
            cut = len(self.pending)
        whole, self.pending = self.pending[:cut], self.pending[cut:]
        return whole


class DiagnosisWatch(DeathWatch):
    """A DeathWatch that also keeps, per rank, the last line a rank wrote
    to stderr that starts with ``[keras_ddl]`` (the engine's diagnosis of a
    fault), and the first such line of the job."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.diagnoses = {}  # rank -> its last keras_ddl line
        self.first_diagnosis = None  # (rank, line)
        self._stderr_lines = {}  # id(agent) -> _WholeLines

    def _handle(self, agent, kind, payload):
        accepted = super()._handle(agent, kind, payload)
        if accepted and kind == STDERR and agent.hello is not None:
            lines = self._stderr_lines.setdefault(id(agent), _WholeLines())
            for line in lines.feed(payload).decode(errors="replace").splitlines():
                self._note_line(agent.hello.get("rank"), line)
        return accepted

    def _note_line(self, rank, line):
        at = line.find(DIAGNOSIS_MARK)
        if at < 0:
            return
        line = line[at:].strip()
        self.diagnoses[rank] = line
        if self.first_diagnosis is None:
            self.first_diagnosis = (rank, line)

    def diagnosis_for(self, rank):
        """(rank, line): ``rank``'s own last diagnosis, else the job's first."""
        if rank in self.diagnoses:
            return rank, self.diagnoses[rank]
        return self.first_diagnosis


class UserStop:
    """Catches SIGINT and SIGTERM for the whole run: records the first,
    forwards it to the running launcher, and wakes whoever waits between
    attempts."""

    def __init__(self, shares_terminal):
        self.signal = None
        self.event = threading.Event()
        self.launcher = None
        self._shares_terminal = shares_terminal
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._caught)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _caught(self, signum, _frame):
        if self.signal is None:
            self.signal = signum
        self.event.set()
        launcher = self.launcher
        if launcher is None or launcher.poll() is not None:
            return
        # A Ctrl-C typed in the launcher's terminal reached the launcher too.
        if signum != signal.SIGINT or not self._shares_terminal():
            launcher.send_signal(signum)


def end_launcher(launcher, why):
    """SIGTERM, then SIGKILL, to a launcher that does not end by itself."""
    sys.stderr.write(f"ddlrun: {why}; stopping the launcher\n")
    sys.stderr.flush()
    launcher.terminate()
    try:
        launcher.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()


def wait_for_launcher(launcher, watch, stop):
    """The launcher's exit code; ends it when a rank failed END_GRACE_S ago
    (or a signal was forwarded KILL_GRACE_S ago) and it still runs."""
    signalled_at = None
    while True:
        try:
            return launcher.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if stop.signal is not None:
            signalled_at = signalled_at or now
            if now - signalled_at > END_GRACE_S:
                end_launcher(launcher, f"the job outlived {signal.Signals(stop.signal).name} "
                                       f"by {END_GRACE_S:.0f} s")
                return launcher.wait()
        failure = watch.first_failure()
        if failure is not None and now - watch.started_at - failure.seconds > END_GRACE_S:
            end_launcher(launcher, f"rank {failure.rank} failed {END_GRACE_S:.0f} s ago and "
                                   "the job still runs")
            return launcher.wait()


def run_attempt(command_for, prefix_output, address, env, restart, stop):
    """Launches the job once and waits for its end."""
    watch = DiagnosisWatch(*address, prefix_output=prefix_output)
    cmd = command_for(watch.address)
    child_env = dict(os.environ, **env)
    child_env[TOKEN_VARIABLE] = watch.token
    child_env[RESTART_VARIABLE] = str(restart)
    started = time.monotonic()
    try:
        launcher = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
    except OSError as e:
        watch.stop(0)
        sys.stderr.write(f"ddlrun: cannot start {cmd[0]}: {e}\n")
        return Attempt(127, started, time.monotonic(), None, None, None, None)
    watch.started_at = started
    watch.start(launcher.stdout, launcher.stderr)
    stop.launcher = launcher
    try:
        code = wait_for_launcher(launcher, watch, stop)
    finally:
        stop.launcher = None
        watch.stop()
        launcher.stdout.close()
        launcher.stderr.close()
    failure = watch.first_failure()
    diagnosis = None
    if failure is not None:
        diagnosis = watch.diagnosis_for(failure.rank)
    elif watch.first_diagnosis is not None:
        diagnosis = watch.first_diagnosis
    failed_at = started + failure.seconds if failure is not None else None
    return Attempt(code, started, time.monotonic(), failure, failed_at, diagnosis, stop.signal)


def describe_failure(attempt):
    """Why an attempt failed, in one sentence."""
    failure = attempt.failure
    if failure is None:
        cause = (f"the launcher ended with {describe_status(attempt.code)} and no rank "
                 "reported a failure")
    else:
        rank = "a rank of unknown number" if failure.rank is None else f"rank {failure.rank}"
        cause = (f"{rank} on {failure.host} ended first ({failure.how}), "
                 f"{failure.seconds:.1f} s after launch")
    if attempt.diagnosis is not None:
        rank, line = attempt.diagnosis
        cause += f"; rank {rank} diagnosed: {line}"
    return cause


def say(text):
    sys.stderr.write(f"ddlrun: {text}\n")
    sys.stderr.flush()


def run_with_restarts(command_for, prefix_output, address, env, max_restarts, delay_s,
                      shares_terminal):
    """Runs the job until an attempt succeeds, a signal stops it, or
    ``max_restarts`` restarts have failed too; returns the exit code.

    ``command_for(agent_address)`` builds one attempt's launcher command;
    ``address`` is (bind address, advertised address) for the agents."""
    lost = 0.0
    restarts = 0
    with UserStop(shares_terminal) as stop:
        while True:
            attempt = run_attempt(command_for, prefix_output, address, env, restarts, stop)
            if attempt.code == 0 and attempt.stopped_by is None:
                if restarts:
                    say(f"the job succeeded after {restarts} restart(s); "
                        f"{lost:.1f} s lost between failures and relaunches")
                return 0
            if attempt.stopped_by is not None:
                name = signal.Signals(attempt.stopped_by).name
                say(f"{name} received: the job was stopped, not restarted "
                    f"(exit code {attempt.code})")
                return attempt.code
            cause = describe_failure(attempt)
            if restarts >= max_restarts:
                say(f"the job failed (exit code {attempt.code}); {cause}. Giving up: "
                    f"{restarts} restart(s) done, --max-restarts {max_restarts}")
                return attempt.code
            # A scheduler's SIGTERM can reach the ranks just before ddlrun:
            # the wait gives it time to arrive and cancel the relaunch.
            if stop.event.wait(delay_s):
                name = signal.Signals(stop.signal).name
                say(f"{name} received after attempt {restarts + 1} failed ({cause}): "
                    "not restarting")
                return attempt.code
            restarts += 1
            failed_at = attempt.failed_at if attempt.failed_at is not None else attempt.ended
            this_loss = time.monotonic() - failed_at
            lost += this_loss
            say(f"restart {restarts} of at most {max_restarts}: attempt {restarts} failed "
                f"(exit code {attempt.code}); {cause}. Time lost: {this_loss:.1f} s from the "
                "failure to this relaunch, plus the work done since the script's last backup")
