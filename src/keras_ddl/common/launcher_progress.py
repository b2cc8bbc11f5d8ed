"""Tells ddlrun how far training got, so that it can measure what a fault
cost: from the last step before it to the step at which the relaunched job
is back where it was (docs/failures.md).

Under ddlrun, each rank's agent gives the rank a pipe, named by
``DDLRUN_PROGRESS_FD`` as ``FD:INODE`` (keras_ddl_launcher/agent.py). Lines
written to it, one event each:

    step S       S optimizer steps are done (counted from the run's start)
    backup S     the backup holding the state after step S is complete
    resumed S    this attempt starts from the backup of step S (0: none)

Writes never block training: the pipe is non-blocking and a report that
does not fit is dropped. Without ddlrun (or if the descriptor is no longer
that pipe, in a process that inherited the variable but not the pipe)
``report`` does nothing. Standard library only.
"""

import os
import stat

VARIABLE = "DDLRUN_PROGRESS_FD"  # the agent's name for it

_fd = None       # the pipe's descriptor, once checked
_checked = False


def _pipe():
    """The progress pipe's descriptor, or None."""
    global _fd, _checked
    if _checked:
        return _fd
    _checked = True
    fd_text, _, inode = os.environ.get(VARIABLE, "").partition(":")
    if not fd_text.isdigit() or not inode.isdigit():
        return None
    fd = int(fd_text)
    try:
        info = os.fstat(fd)
        if not stat.S_ISFIFO(info.st_mode) or info.st_ino != int(inode):
            return None
        os.set_blocking(fd, False)
    except OSError:
        return None
    _fd = fd
    return _fd


def report(event, step):
    """Tells ddlrun that ``event`` ("step", "backup" or "resumed", above)
    happened at optimizer step ``step``; does nothing outside ddlrun."""
    global _fd
    fd = _pipe()
    if fd is None:
        return
    try:
        os.write(fd, f"{event} {int(step)}\n".encode())
    except BlockingIOError:
        pass  # ddlrun is behind: this report is dropped, the next one counts
    except OSError:
        _fd = None  # the agent is gone
