"""ddlrun --max-restarts N: run the job again when a rank fails; the script
resumes from its BackupAndRestore directory (keras_ddl.callbacks.
BackupAndRestore), so a restarted job ends with the weights an
uninterrupted one would have.

One attempt is one launch of the whole job. When a rank ends other than
with exit code 0, the MPI launcher ends the others (and if it has not after
``END_GRACE_S``, ddlrun does: Slurm's srun, for one, lets the other tasks
run on). ddlrun prints why the attempt failed (the rank that ended first,
its host, its exit code or signal, and the last keras_ddl diagnosis line a
rank printed), waits ``--restart-delay-s``, and launches again, at most N
times; then it gives up with the last attempt's exit code. Where each
attempt runs is the plan's business: ``SameHosts`` (the same hosts and size
every time) or, with --min-np/--max-np/--host-discovery-script, the hosts
that are left (elastic.py).

A signal to ddlrun (Ctrl-C, or the SIGTERM Slurm sends at the end of a job
or on preemption) is the user's or the scheduler's decision, not a fault:
it is forwarded to the job and no attempt follows, even one already
waiting to start. Every attempt's ranks see ``DDLRUN_RESTART_COUNT``
(0 for the first launch), as torchrun's TORCHELASTIC_RESTART_COUNT.

Ranks that report their progress (BackupAndRestore does, through the
agents: progress.py) let ddlrun measure what each fault cost: once a
relaunched attempt is back at the step where the failed one last made
progress, ddlrun prints the time lost and what it was spent on.

Imported only when --max-restarts is given: ``ddlrun --help`` loads as
little as it can.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

from .agent import PROGRESS, STDERR, TOKEN_VARIABLE, describe_status
from .deathwatch import DeathWatch
from .progress import CatchUp, Progress

RESTART_VARIABLE = "DDLRUN_RESTART_COUNT"
DIAGNOSIS_MARK = "[keras_ddl]"
# What makes a keras_ddl line a fault diagnosis, and how it names each
# peer it could not reach (docs/failures.md, custom_ops/engine/
# fault_report.cc): "rank R on HOST gone|stopped|unreachable: ...".
FAULT_MARK = " lost contact in "
PEER_ENTRY = re.compile(r"\brank (\d+) on (\S+) (gone|stopped|unreachable):")
# After a rank failed, how long the launcher has to end the others itself.
# A dead rank ends the job within 30 s (docs/failures.md): the ranks' own
# diagnosis takes DDL_PEER_TIMEOUT_S plus a few seconds.
END_GRACE_S = 30.0
# After SIGTERM, how long the launcher has before SIGKILL.
KILL_GRACE_S = 10.0
# Elastic plans: once every rank still running is one the others diagnosed
# unreachable, how long the launcher has to end by itself before ddlrun
# stops it (it would wait for a host it can no longer reach).
SILENT_GRACE_S = 0.5
POLL_S = 0.25  # how often ddlrun looks at the launcher while it runs
LAUNCHER_TEXT_BYTES = 65536  # the launcher's own output kept for the plan


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
    """A DeathWatch that also keeps what a plan needs after a failure: per
    rank, the last line it wrote to stderr that starts with ``[keras_ddl]``
    (and the last fault diagnosis among them), the first such line of the
    job, the tail of the launcher's own output, and the training's
    progress; and that notes what the fault cost (``caught_up``) when this
    attempt is back at ``catch_up``'s step."""

    def __init__(self, *args, catch_up=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.diagnoses = {}  # rank -> its last keras_ddl line
        self.fault_lines = {}  # rank -> its last fault diagnosis
        self.first_diagnosis = None  # (rank, line)
        self.launcher_text = b""
        self.progress = Progress()
        self.catch_up = catch_up
        self.caught_up = None  # a progress.TimeLost once back at catch_up's step
        self.time_lost_said = False
        self._lines = {}  # (id(agent), kind) -> _WholeLines

    def _handle(self, agent, kind, payload):
        accepted = super()._handle(agent, kind, payload)
        if accepted and kind in (STDERR, PROGRESS) and agent.hello is not None:
            lines = self._lines.setdefault((id(agent), kind), _WholeLines())
            for line in lines.feed(payload).decode(errors="replace").splitlines():
                if kind == STDERR:
                    self._note_line(agent.hello.get("rank"), line)
                else:
                    self._note_progress(line)
        return accepted

    def _launcher_said(self, chunk):
        self.launcher_text = (self.launcher_text + chunk)[-LAUNCHER_TEXT_BYTES:]

    def _note_line(self, rank, line):
        at = line.find(DIAGNOSIS_MARK)
        if at < 0:
            return
        line = line[at:].strip()
        self.diagnoses[rank] = line
        if FAULT_MARK in line:
            self.fault_lines[rank] = line
        if self.first_diagnosis is None:
            self.first_diagnosis = (rank, line)

    def _note_progress(self, line):
        now = time.monotonic()
        if not self.progress.note(line, now) or self.catch_up is None or self.caught_up:
            return
        self.caught_up = self.catch_up.reached(self.progress, now)

    def diagnosis_for(self, rank):
        """(rank, line): ``rank``'s own last diagnosis, else the job's first."""
        if rank in self.diagnoses:
            return rank, self.diagnoses[rank]
        return self.first_diagnosis

    def silent_ranks(self):
        """Ranks that said hello and have not ended (safe to call while the
        watch runs: it reads copies)."""
        ended = {d.rank for d in list(self.deaths)}
        return sorted(r for r in list(self.ranks) if r not in ended)


class Attempt:
    """One launch of the job and how it ended.

    ``code``: the launcher's exit code; ``started``/``ended``: its start
    and end (time.monotonic()); ``failure``: the first rank to fail (a
    deathwatch.Death) or None; ``failed_at``: when; ``diagnosis``: (rank,
    line) to quote; ``stopped_by``: the signal that stopped ddlrun, or
    None; ``watch``: the attempt's DiagnosisWatch (its ranks, deaths,
    diagnoses, launcher output and progress); ``start_timed_out``: ranks
    had not all started when ``start_timeout_s`` passed."""

    def __init__(self, code, started, ended, watch=None, stopped_by=None,
                 start_timed_out=False):
        self.code = code
        self.started = started
        self.ended = ended
        self.watch = watch
        self.stopped_by = stopped_by
        self.start_timed_out = start_timed_out
        self.failure = watch.first_failure() if watch is not None else None
        self.failed_at = started + self.failure.seconds if self.failure is not None else None
        self.diagnosis = None
        if watch is not None:
            self.diagnosis = (watch.diagnosis_for(self.failure.rank) if self.failure is not None
                              else watch.first_diagnosis)

    @property
    def progress(self):
        return self.watch.progress if self.watch is not None else Progress()


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


def peer_states(line):
    """{rank: "gone" | "stopped" | "unreachable"} of the peers a fault
    diagnosis lists after "Unreachable:" (empty if it lists none)."""
    at = line.find("Unreachable:")
    if at < 0:
        return {}
    return {int(m.group(1)): m.group(3) for m in PEER_ENTRY.finditer(line, at)}


def cut_off_ranks(watch):
    """Ranks still running that every fault diagnosis received names
    unreachable (none if there is no diagnosis)."""
    silent = watch.silent_ranks()
    states = [peer_states(line) for line in list(watch.fault_lines.values())]
    if not silent or not states:
        return []
    if all(all(s.get(r) == "unreachable" for r in silent) for s in states):
        return silent
    return []


def say_time_lost(watch):
    """Prints, once, what the fault cost if the attempt is back where the
    failed one last made progress."""
    lost = watch.caught_up
    if lost is None or watch.time_lost_said:
        return
    watch.time_lost_said = True
    if lost.relaunches != 1:
        say(f"back at step {lost.step}, where attempt {lost.attempt} last made progress: "
            f"{lost.total:.1f} s lost to the fault, over {lost.relaunches} relaunches")
        return
    say(f"back at step {lost.step}, where attempt {lost.attempt} last made progress: "
        f"{lost.total:.1f} s lost to the fault = {lost.detect:.1f} s to detect it and end the "
        f"attempt + {lost.relaunch:.1f} s to relaunch and resume from step {lost.resumed_step} "
        f"+ {lost.redo:.1f} s to redo {lost.redone} step(s)")


def wait_for_launcher(launcher, watch, stop, plan):
    """The launcher's exit code and whether the ranks' start timed out;
    ends the launcher when a rank failed END_GRACE_S ago (or a signal was
    forwarded KILL_GRACE_S ago) and it still runs. An elastic plan also
    ends it when its ranks have not all said hello within its start
    timeout, or when only ranks cut off from all others still run."""
    signalled_at = None
    cut_off_since = None
    while True:
        try:
            return launcher.wait(timeout=POLL_S), False
        except subprocess.TimeoutExpired:
            pass
        say_time_lost(watch)
        now = time.monotonic()
        if stop.signal is not None:
            signalled_at = signalled_at or now
            if now - signalled_at > END_GRACE_S:
                end_launcher(launcher, f"the job outlived {signal.Signals(stop.signal).name} "
                                       f"by {END_GRACE_S:.0f} s")
                return launcher.wait(), False
        if plan.elastic:
            missing = plan.world_size - len(watch.ranks)
            if missing > 0 and now - watch.started_at > plan.start_timeout_s:
                end_launcher(launcher, f"{missing} rank(s) did not start within "
                                       f"{plan.start_timeout_s:g} s of the launch")
                return launcher.wait(), True
        failure = watch.first_failure()
        if failure is None:
            continue
        if now - watch.started_at - failure.seconds > END_GRACE_S:
            end_launcher(launcher, f"rank {failure.rank} failed {END_GRACE_S:.0f} s ago and "
                                   "the job still runs")
            return launcher.wait(), False
        if plan.elastic:
            cut_off = cut_off_ranks(watch)
            cut_off_since = (cut_off_since or now) if cut_off else None
            if cut_off and now - cut_off_since > SILENT_GRACE_S:
                end_launcher(launcher, f"only rank(s) {cut_off} still run, and every "
                                       "diagnosis names them unreachable")
                return launcher.wait(), False


def run_attempt(plan, prefix_output, address, restart, stop, catch_up, startup=None):
    """Launches the job once, as ``plan`` says, and waits for its end."""
    watch = DiagnosisWatch(*address, prefix_output=prefix_output, catch_up=catch_up,
                           startup=startup)
    cmd = plan.command(watch.address)
    child_env = dict(os.environ, **plan.env())
    child_env[TOKEN_VARIABLE] = watch.token
    child_env[RESTART_VARIABLE] = str(restart)
    started = time.monotonic()
    try:
        launcher = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
    except OSError as e:
        watch.stop(0)
        sys.stderr.write(f"ddlrun: cannot start {cmd[0]}: {e}\n")
        return Attempt(127, started, time.monotonic())
    watch.started_at = started
    watch.start(launcher.stdout, launcher.stderr)
    stop.launcher = launcher
    try:
        code, start_timed_out = wait_for_launcher(launcher, watch, stop, plan)
    finally:
        stop.launcher = None
        # Output from ranks cut off from everyone cannot arrive: no need
        # to wait for it.
        watch.stop(timeout=0.5 if plan.elastic and cut_off_ranks(watch) else 5.0)
        say_time_lost(watch)
        launcher.stdout.close()
        launcher.stderr.close()
    return Attempt(code, started, time.monotonic(), watch, stop.signal, start_timed_out)


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


def time_lost_so_far(attempt, now):
    """'X s since ...': from the attempt's last progress (or its first
    failure, or its end) to ``now``."""
    last = attempt.progress.last_step
    if last is not None:
        return f"{now - last.at:.1f} s since the job last made progress (step {last.step})"
    if attempt.failed_at is not None:
        return f"{now - attempt.failed_at:.1f} s since the first rank failed"
    return f"{now - attempt.ended:.1f} s since the attempt ended"


def say(text):
    sys.stderr.write(f"ddlrun: {text}\n")
    sys.stderr.flush()


class SameHosts:
    """Every attempt is the same launch: the same hosts, the same size.

    Args:
        command_for: agent address -> the launcher's command line.
        env: the DDL_* settings for the ranks.
    """

    elastic = False
    world_size = None

    def __init__(self, command_for, env):
        self._command_for = command_for
        self._env = env

    def command(self, agent_address):
        return self._command_for(agent_address)

    def env(self):
        return dict(self._env)

    def after_failure(self, attempt, restart, time_lost):
        """Whether to go on after a failed attempt: always."""
        return True


def next_catch_up(pending, attempt, number):
    """The step the next attempt must finish again: a pending one that was
    not reached yet, else this failed attempt's last step (or None)."""
    if pending is not None and not attempt.watch.caught_up:
        pending.relaunches += 1
        return pending
    last = attempt.progress.last_step
    if last is None:
        return None
    catch_up = CatchUp(number, last.step, last.at, attempt.ended)
    catch_up.relaunches = 1
    return catch_up


def run_with_restarts(plan, prefix_output, address, max_restarts, delay_s, shares_terminal,
                      startup=None):
    """Runs the job until an attempt succeeds, a signal stops it, ``plan``
    says it cannot go on, or ``max_restarts`` restarts have failed too;
    returns the exit code.

    ``plan``: SameHosts or an elastic.ElasticPlan; ``address`` is (bind
    address, advertised address) for the agents; ``startup``: the run's
    startup_lines.StartupLines (one note over all attempts)."""
    lost = 0.0
    restarts = 0
    catch_up = None
    with UserStop(shares_terminal) as stop:
        while True:
            attempt = run_attempt(plan, prefix_output, address, restarts, stop, catch_up,
                                  startup)
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
            go_on = plan.after_failure(attempt, restarts + 1,
                                       time_lost_so_far(attempt, time.monotonic()))
            if not go_on:
                say(f"the job failed (exit code {attempt.code}); {cause}. Giving up: too few "
                    f"slots are left for --min-np {plan.min_np}")
                return attempt.code
            restarts += 1
            if attempt.watch is not None:
                catch_up = next_catch_up(catch_up, attempt, restarts)
            failed_at = attempt.failed_at if attempt.failed_at is not None else attempt.ended
            this_loss = time.monotonic() - failed_at
            lost += this_loss
            say(f"restart {restarts} of at most {max_restarts}: attempt {restarts} failed "
                f"(exit code {attempt.code}); {cause}. Time lost: {this_loss:.1f} s from the "
                "failure to this relaunch, plus the work done since the script's last backup")
