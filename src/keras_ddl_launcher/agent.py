"""The rank agent: ddlrun's hands on every host, one per rank.

ddlrun has the MPI launcher start ``python -I agent.py HOST:PORT -- CMD...``
in place of ``CMD...``. The agent connects back to ddlrun over TCP, says who
it is (rank from the launcher's environment, host, pid, and the job's token
from DDLRUN_TOKEN), waits for ddlrun's yes, then starts CMD with its stdout
and stderr on pipes and sends what CMD writes to ddlrun, which prints it as
whole lines. A third pipe, named to CMD by DDLRUN_PROGRESS_FD, carries the
training's progress (steps done, backups written) to ddlrun, which uses it
to measure the time a fault cost. When CMD ends, the agent reports how (exit code or signal) at
once, before the launcher even learns of it, so ddlrun can name the rank
that ended first on any host. The agent then ends the same way CMD did, so
the launcher sees what it would have seen without the agent. CMD stays in
the agent's process group: the launchers signal that group, CMD gets each
signal once, and the agent outlives it to report. If the agent is killed,
CMD is killed too (PR_SET_PDEATHSIG).

If ddlrun cannot be reached, the agent warns and runs CMD in its own place
(exec): the job runs, unprefixed and without the death watch.

Runs as a plain script (``-I``: no user site, no PYTHONPATH) and imports
only the standard library: it must start in milliseconds on every rank and
never import TensorFlow. ddlrun imports the wire format from here.
"""

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time

# Wire format, agent -> ddlrun: frames of (1-byte kind, 4-byte big-endian
# length, payload). HELLO and EXIT carry JSON; STDOUT, STDERR and PROGRESS
# raw bytes (PROGRESS: the lines CMD writes to its progress pipe).
HEADER = struct.Struct("!cI")
HELLO, STDOUT, STDERR, EXIT, PROGRESS = b"H", b"O", b"E", b"X", b"P"
ACCEPTED = b"K"  # ddlrun -> agent, once, after a hello with the job's token
TOKEN_VARIABLE = "DDLRUN_TOKEN"
# CMD's end of the progress pipe, as "FD:INODE" (keras_ddl/common/
# launcher_progress.py writes to it only if FD is still that pipe).
PROGRESS_VARIABLE = "DDLRUN_PROGRESS_FD"
# The rank as each launcher tells it: MPICH hydra, Open MPI, PMIx, Slurm.
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
CONNECT_TIMEOUT_S = 10.0
DRAIN_AFTER_EXIT_S = 1.0  # output still in the pipes after CMD ended
SURVIVED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                    signal.SIGUSR2)


def frame(kind, payload):
    return HEADER.pack(kind, len(payload)) + payload


def rank_from_environment(environ=os.environ):
    for name in RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def describe_status(returncode):
    """'exit code 3' or 'killed by SIGKILL' from a Popen returncode."""
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _survive(signum, frame):
    pass  # a handler, not SIG_IGN: CMD must not inherit ignoring it


def _die_with_parent():
    # If the agent is killed (SIGKILL cannot be forwarded), so is CMD.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Channel:
    """The connection to ddlrun; falls back to the agent's own stdout and
    stderr if ddlrun goes away mid-run."""

    def __init__(self, sock):
        self.sock = sock

    def send(self, kind, payload):
        if self.sock is not None:
            try:
                self.sock.sendall(frame(kind, payload))
                return
            except OSError:
                self.sock = None
        if kind in (STDOUT, STDERR):
            _write_all(1 if kind == STDOUT else 2, payload)

    def close(self):
        if self.sock is not None:
            self.sock.close()


def _write_all(fd, data):
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


def connect(address, hello):
    """A socket to ddlrun that accepted ``hello``, or the reason there is none."""
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as e:
        return None, str(e)
    try:
        sock.sendall(frame(HELLO, json.dumps(hello).encode()))
        answer = sock.recv(1)  # ddlrun says yes, or closes on a stranger
    except OSError as e:
        sock.close()
        return None, str(e)
    if answer != ACCEPTED:
        sock.close()
        return None, "ddlrun refused this agent (not its job's token)"
    sock.settimeout(None)
    return sock, None


def run(address, command):
    rank = rank_from_environment()
    hello = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
             "token": os.environ.pop(TOKEN_VARIABLE, "")}
    sock, why = connect(address, hello)
    if sock is None:
        sys.stderr.write(f"ddlrun agent (rank {rank} on {hello['host']}): cannot reach ddlrun "
                         f"at {address} ({why}); running without it: output is not prefixed "
                         "and a death here is not named\n")
        sys.stderr.flush()
        os.execvp(command[0], command)
    channel = Channel(sock)
    # How far training got, for ddlrun's account of the time a fault cost.
    progress_read, progress_write = os.pipe()
    os.set_inheritable(progress_write, True)
    os.environ[PROGRESS_VARIABLE] = f"{progress_write}:{os.fstat(progress_write).st_ino}"
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 close_fds=False, preexec_fn=_die_with_parent)
    except OSError as e:
        channel.send(STDERR, f"ddlrun agent: cannot start {command[0]}: {e}\n".encode())
        channel.send(EXIT, json.dumps({"returncode": 127}).encode())
        channel.close()
        return 127
    finally:
        os.close(progress_write)
    # The launchers signal the rank's whole process group (CMD is in the
    # agent's): the agent only has to outlive the signal to report the end.
    for signum in SURVIVED_SIGNALS:
        signal.signal(signum, _survive)
    returncode = relay(child, channel, progress_read)
    channel.close()
    os.close(progress_read)
    return returncode


def relay(child, channel, progress_fd):
    """Sends CMD's output and progress until it ends; reports the end the
    moment it happens (pidfd), then drains what is left in the pipes."""
    sel = selectors.DefaultSelector()
    for fd, kind in ((child.stdout.fileno(), STDOUT), (child.stderr.fileno(), STDERR),
                     (progress_fd, PROGRESS)):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, kind)
    pipes = 3
    pidfd = os.pidfd_open(child.pid) if hasattr(os, "pidfd_open") else None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, EXIT)
    ended_at = None
    while True:
        if ended_at is not None:
            timeout = ended_at + DRAIN_AFTER_EXIT_S - time.monotonic()
            if pipes == 0 or timeout <= 0:
                break
        elif pipes == 0 and pidfd is None:
            break
        else:
            timeout = None
        for key, _ in sel.select(timeout):
            if key.data == EXIT:
                sel.unregister(pidfd)
                os.close(pidfd)
                channel.send(EXIT, json.dumps({"returncode": child.wait()}).encode())
                ended_at = time.monotonic()
                continue
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if data:
                channel.send(key.data, data)
            else:
                sel.unregister(key.fd)
                pipes -= 1
    if ended_at is None:  # no pidfd (Linux < 5.3): the pipes closed, CMD is ending
        channel.send(EXIT, json.dumps({"returncode": child.wait()}).encode())
    return child.returncode


def end_like(returncode):
    """Exits with CMD's exit code, or dies of the signal that killed it."""
    if returncode is not None and returncode < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            import resource
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # CMD's core, not ours
        except (ImportError, ValueError, OSError):
            pass
        try:
            signal.signal(-returncode, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP: cannot be caught anyway
        os.kill(os.getpid(), -returncode)
        time.sleep(1)
        return 128 - returncode
    return returncode


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: agent.py HOST:PORT -- COMMAND [ARGS...] (started by ddlrun)\n")
        return 2
    return end_like(run(argv[0], argv[2:]))


if __name__ == "__main__":
    sys.exit(main())
