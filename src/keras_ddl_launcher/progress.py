"""ddlrun's view of how far training got in one attempt, from the progress
lines ranks write (keras_ddl/common/launcher_progress.py, relayed by the
agents), and the account of the time a fault cost.

The time a fault costs runs from the last step the failed attempt finished
to the moment a relaunched attempt finishes that step again. It is made of
the time to detect the fault and end the attempt, the relaunch (restart
delay, process start, restore from the backup) and the steps done again
since that backup, which ``BackupAndRestore(save_freq=N)`` bounds by N.
"""

import collections

Report = collections.namedtuple("Report", "step at")  # at: time.monotonic()


class Progress:
    """The progress lines of one attempt (any rank; steps are global)."""

    def __init__(self):
        self.last_step = None   # Report: the most advanced step done
        self.last_backup = None  # Report: the newest complete backup
        self.resumed = None     # Report: where this attempt started from
        self.first_step = None  # Report: the first step this attempt finished

    def note(self, line, now):
        """Takes one line ``EVENT STEP``; returns True if it was one."""
        words = line.split()
        if len(words) != 2 or not words[1].isdigit():
            return False
        event, step = words[0], int(words[1])
        report = Report(step, now)
        if event == "step":
            if self.first_step is None:
                self.first_step = report
            if self.last_step is None or step > self.last_step.step:
                self.last_step = report
        elif event == "backup":
            if self.last_backup is None or step >= self.last_backup.step:
                self.last_backup = report
        elif event == "resumed":
            self.resumed = report
        else:
            return False
        return True


# What a fault cost, once the job is back at the step it had reached: all
# times in seconds. detect: from the last step to the failed attempt's end;
# relaunch: from there to the relaunched attempt's resume; redo: from there
# to the step again, redoing ``redone`` steps from ``resumed_step``. With
# several relaunches in between, only ``total`` is meaningful.
TimeLost = collections.namedtuple(
    "TimeLost", "step attempt total relaunches detect relaunch resumed_step redo redone")


class CatchUp:
    """What a failed attempt had reached: ``step`` done at ``progress_at``;
    the attempt ended at ``ended_at``. A later attempt that finishes
    ``step`` again is back where the fault struck."""

    def __init__(self, attempt, step, progress_at, ended_at):
        self.attempt = attempt  # 1-based number of the attempt that failed
        self.step = step
        self.progress_at = progress_at
        self.ended_at = ended_at
        self.relaunches = 0     # launches since that attempt

    def reached(self, progress, now):
        """A TimeLost if ``progress`` (of a later attempt) is back at
        ``step``, else None."""
        back = progress.last_step is not None and progress.last_step.step >= self.step
        if progress.resumed is not None and progress.resumed.step >= self.step:
            back = True
        if not back:
            return None
        start = progress.resumed or progress.first_step
        resumed_at = start.at if start is not None else now
        resumed_step = progress.resumed.step if progress.resumed is not None else 0
        return TimeLost(self.step, self.attempt, now - self.progress_at, self.relaunches,
                        self.ended_at - self.progress_at, resumed_at - self.ended_at,
                        resumed_step, now - resumed_at, max(0, self.step - resumed_step))
