"""Starting MPICH under ``srun --mpi=pmi2``: a relay between MPICH's PMI
client and Slurm's PMI server that keeps every request short enough for
Slurm to read whole.

Why it is needed (Slurm 22.05 and MPICH 5 with UCX, the mpich wheel):

- MPICH's PMI client speaks the PMI-1 wire protocol by default (lines of
  ``cmd=... key=value``); Slurm's ``mpi/pmi2`` plugin serves it, and reads
  each PMI-1 request with a single ``read()`` of at most 1024 bytes.
- At ``MPI_Init``, MPICH publishes each rank's UCX address as a fixed
  4096-byte business card (``MPID_MAX_BC_SIZE``), hex-encoded with runs
  compressed, cut into values of up to ``vallen_max`` characters, which Slurm
  gives as 1024. A full value plus ``cmd=put kvsname=... key=...-seg-N/M
  value=`` is about 1077 bytes: Slurm keeps the first 1024 (a truncated
  value) and parses the rest as a request of its own ("request not begin
  with 'cmd='" in slurmd's log).
- The card is longer than UCX's address, and the bytes after it are whatever
  the heap held. In a fresh process they are mostly zeros and compress, so
  the values stay short and mpi4py alone starts; after ``import tensorflow``
  the heap is full of docstrings, the values reach the full 1024 characters,
  and UCX cannot read the truncated addresses ("failed to unpack address,
  invalid bandwidth 0.00", ``MPIDI_UCX_comm_addr_exchange``: "Invalid
  parameter").

The relay runs as a small process of its own (MPI_Init holds the GIL, so
a thread could not answer): it holds Slurm's socket (``PMI_FD``), gives MPI a
socket of its own instead, passes every line through unchanged except
Slurm's answer to ``cmd=get_maxes``, whose ``vallen_max`` it lowers so that a
request with the longest key and value still fits in one read. A client
that speaks anything other than PMI-1 (PMI-2's length-prefixed messages) is
passed through untouched. The relay ends when either side closes.
"""

import os
import re
import socket
import stat
import subprocess
import sys
import threading

# What Slurm's mpi/pmi2 plugin reads of one PMI-1 request (MAX_READLINE).
SLURM_PMI1_READ = 1024
# Room for "cmd=put kvsname=<jobid.step> key=<up to keylen_max> value=" and
# the newline, with keylen_max 64 as Slurm gives it.
REQUEST_OVERHEAD = 128
SAFE_VALLEN = SLURM_PMI1_READ - REQUEST_OVERHEAD
_MAXES = re.compile(rb"^(cmd=maxes\b.*\bvallen_max=)(\d+)")


def needs_relay(environ, mpi_started=None):
    """Whether this process was started by Slurm's pmi2 plugin (a PMI
    socket in PMI_FD) and MPI is not initialised yet. ``mpi_started``: None
    reads it from this process (mpi4py's MPI imported: MPI_Init ran at that
    import); a test that hands in its own PMI socket says False."""
    if mpi_started is None:
        mpi_started = "mpi4py.MPI" in sys.modules
    if mpi_started:
        return False  # too late
    return (environ.get("SLURM_MPI_TYPE") == "pmi2" and environ.get("PMI_FD", "").isdigit()
            and environ.get("DDL_PMI_RELAY_ACTIVE") is None)


def start_relay(environ=os.environ, mpi_started=None):
    """Puts the relay between this process's MPI and Slurm, if needed:
    PMI_FD then names the relay's socket. Returns the relay's Popen or None.
    ``mpi_started`` as for needs_relay."""
    if not needs_relay(environ, mpi_started):
        return None
    slurm_fd = int(environ["PMI_FD"])
    try:
        is_socket = stat.S_ISSOCK(os.fstat(slurm_fd).st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        return None  # not Slurm's PMI socket: MPI reports what it finds
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), str(slurm_fd), str(theirs.fileno())],
        pass_fds=(slurm_fd, theirs.fileno()), stdin=subprocess.DEVNULL,
        env={"PATH": environ.get("PATH", "")})
    theirs.close()
    os.close(slurm_fd)
    # MPICH reads PMI_FD in this process; the descriptor is ours to keep open
    # for MPI's whole life (MPI_Finalize speaks PMI too).
    fd = os.dup(ours.fileno())
    ours.close()
    environ["PMI_FD"] = str(fd)
    environ["DDL_PMI_RELAY_ACTIVE"] = "1"  # a child Python must not relay again
    return proc


def rewrite_maxes(line):
    """Slurm's ``cmd=maxes`` answer with vallen_max at most SAFE_VALLEN;
    any other line unchanged (bytes in, bytes out)."""
    match = _MAXES.match(line)
    if match is None or int(match.group(2)) <= SAFE_VALLEN:
        return line
    return match.group(1) + str(SAFE_VALLEN).encode() + line[match.end():]


def _pump(src, dst, by_line, rewrite, first_chunk=b""):
    """Copies src to dst until EOF. With by_line, whole lines only, each in
    one write (Slurm takes one read as one request) and through rewrite."""
    pending = first_chunk
    while True:
        if by_line:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                _write_all(dst, rewrite(line + b"\n"))
        elif pending:
            _write_all(dst, pending)
            pending = b""
        try:
            chunk = os.read(src, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                _write_all(dst, pending)
            return
        pending += chunk


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            return


def relay(slurm_fd, task_fd):
    """Runs the relay until either side closes."""
    # The first request tells the protocol: PMI-1 starts "cmd=init".
    first = os.read(task_fd, 65536)
    pmi1 = first.startswith(b"cmd=")
    done = threading.Event()

    def run(*args, **kwargs):
        try:
            _pump(*args, **kwargs)
        finally:
            done.set()

    up = threading.Thread(target=run, args=(task_fd, slurm_fd, pmi1, lambda b: b),
                          kwargs={"first_chunk": first}, daemon=True)
    down = threading.Thread(target=run, args=(slurm_fd, task_fd, pmi1, rewrite_maxes),
                            daemon=True)
    up.start()
    down.start()
    done.wait()


if __name__ == "__main__":
    relay(int(sys.argv[1]), int(sys.argv[2]))
