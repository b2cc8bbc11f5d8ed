"""ddlrun's end of the rank agents: which rank ended first, on any host, and
every rank's output as whole lines.

ddlrun listens on a TCP socket; every rank's agent (agent.py) connects to it
from whatever host the launcher put the rank on, says who it is, relays the
rank's stdout and stderr, and reports how the rank ended the moment it
ends. When one rank dies, the MPI launcher kills the others and names one
PID, not always the one that died first; here the first report received is
the rank that ended first (an agent reports before it exits, and the
launcher only starts killing after it has seen an agent exit). An agent
killed before it could report (SIGKILL from the launcher's clean-up) is
noted when its connection closes.

This class is also the only writer of ddlrun's stdout and stderr while the
job runs: the ranks' output and the launcher's own arrive on separate
streams and are written one whole line at a time, optionally prefixed with
``[rank] `` as ``mpiexec -l`` does, so lines of different ranks never mix;
progress bars drawn with carriage returns are handled by rank_output.py,
and TensorFlow's start-up lines are left out (startup_lines.py) unless
``--verbose``.
"""

import collections
import hmac
import json
import os
import secrets
import selectors
import socket
import threading
import time

from .agent import ACCEPTED, EXIT, HEADER, HELLO, STDERR, STDOUT, describe_status
from .rank_output import RankOutput, screens_for

Death = collections.namedtuple("Death", "seconds rank host how")
MAX_FRAME = 1 << 24
LOST = "its agent ended without reporting (killed, or its host went away)"


class _Agent:
    def __init__(self, sock):
        self.sock = sock
        self.buffer = bytearray()
        self.hello = None
        self.reported = False
        self.lines = {}


class DeathWatch:
    """Listens on ``bind_host`` (port chosen by the kernel); agents are
    told to connect to ``address`` (``advertise`` or the bound address).
    ``startup``: the run's startup_lines.StartupLines, or None to relay the
    ranks' every line."""

    def __init__(self, bind_host, advertise=None, prefix_output=False, stdout_fd=1,
                 stderr_fd=2, startup=None):
        self.token = secrets.token_hex(16)
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._listener = socket.create_server((bind_host, 0), family=family, backlog=1024)
        self._listener.setblocking(False)
        port = self._listener.getsockname()[1]
        host = advertise or bind_host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.prefix_output = prefix_output
        self.startup = startup
        self.deaths = []  # [Death] in the order the ranks ended
        self.ranks = {}   # rank -> host, of every agent that said hello
        self._fds = {STDOUT: stdout_fd, STDERR: stderr_fd}
        # Progress bars redraw in place on a terminal, and are written once,
        # in their final state, into a file or pipe (rank_output.py).
        screens = screens_for(stdout_fd, stderr_fd)
        self._screens = {STDOUT: screens["stdout"], STDERR: screens["stderr"]}
        self._broken = set()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._deadline = None
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="ddlrun-watch", daemon=True)

    def start(self, launcher_stdout=None, launcher_stderr=None):
        """Also relays the launcher's own output (its pipes), unprefixed."""
        self._start = time.monotonic()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        for pipe, kind in ((launcher_stdout, STDOUT), (launcher_stderr, STDERR)):
            if pipe is not None:
                self._sel.register(pipe, selectors.EVENT_READ,
                                   ("launcher", kind, RankOutput(b"", self._screens[kind])))
        self._thread.start()
        return self

    def stop(self, timeout=5.0):
        """After the launcher ended: relays what is still on its way, then
        closes everything (gives up after ``timeout`` seconds)."""
        self._deadline = time.monotonic() + timeout
        self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join()
        for key in list(self._sel.get_map().values()):
            self._sel.unregister(key.fileobj)
            if isinstance(key.data, _Agent):
                key.data.sock.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def first_failure(self):
        """The first rank to end other than with exit code 0, or None."""
        return next((d for d in self.deaths if d.how != "exit code 0"), None)

    # -- the watch's thread ------------------------------------------------

    def _run(self):
        while True:
            events = self._sel.select(None if not self._stopping else 0.2)
            for key, _ in events:
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    os.read(self._wake_r, 64)
                elif isinstance(key.data, _Agent):
                    self._read_agent(key.data)
                else:
                    self._read_launcher(key.fileobj, key.data)
            if self._stopping and ((not events and not self._busy())
                                   or time.monotonic() > self._deadline):
                return

    def _busy(self):
        # The launcher's pipes, or an agent that said hello, still open.
        return any(not isinstance(k.data, str) and
                   (not isinstance(k.data, _Agent) or k.data.hello is not None)
                   for k in self._sel.get_map().values())

    def _accept(self):
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of descriptors, say: that agent falls back
            sock.setblocking(False)
            self._sel.register(sock, selectors.EVENT_READ, _Agent(sock))

    def _read_launcher(self, pipe, data):
        _, kind, lines = data
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        if chunk:
            self._launcher_said(chunk)
            self._write(kind, lines.feed(chunk))
        else:
            self._write(kind, lines.rest())
            self._sel.unregister(pipe)

    def _launcher_said(self, chunk):
        """Sees what the launcher itself writes (a subclass may keep it)."""

    def _read_agent(self, agent):
        try:
            chunk = agent.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close_agent(agent)
            return
        agent.buffer += chunk
        while len(agent.buffer) >= HEADER.size:
            kind, size = HEADER.unpack_from(agent.buffer)
            if size > MAX_FRAME:
                self._close_agent(agent)
                return
            if len(agent.buffer) < HEADER.size + size:
                break
            payload = bytes(agent.buffer[HEADER.size:HEADER.size + size])
            del agent.buffer[:HEADER.size + size]
            if not self._handle(agent, kind, payload):
                self._close_agent(agent)
                return

    def _handle(self, agent, kind, payload):
        if agent.hello is None:
            if kind != HELLO:
                return False
            try:
                hello = json.loads(payload)
                ok = hmac.compare_digest(str(hello.get("token", "")), self.token)
            except (ValueError, AttributeError):
                return False
            if not ok:
                return False
            try:
                agent.sock.send(ACCEPTED)  # the first byte on a new socket: room for it
            except OSError:
                return False
            agent.hello = hello
            self.ranks[hello.get("rank")] = hello.get("host")
            rank = "?" if hello.get("rank") is None else hello["rank"]
            prefix = f"[{rank}] ".encode() if self.prefix_output else b""
            agent.lines = {kind: RankOutput(prefix, self._screens[kind],
                                            self.startup and self.startup.stream())
                           for kind in (STDOUT, STDERR)}
        elif kind in (STDOUT, STDERR):
            self._write(kind, agent.lines[kind].feed(payload))
        elif kind == EXIT:
            try:
                returncode = json.loads(payload).get("returncode")
            except (ValueError, AttributeError):
                returncode = None
            self._note_death(agent, describe_status(returncode))
        return True

    def _close_agent(self, agent):
        self._sel.unregister(agent.sock)
        agent.sock.close()
        if agent.hello is None:
            return
        for kind, lines in agent.lines.items():
            self._write(kind, lines.rest())
        self._note_death(agent, LOST)

    def _note_death(self, agent, how):
        if agent.reported:
            return
        agent.reported = True
        self.deaths.append(Death(time.monotonic() - self._start, agent.hello.get("rank"),
                                 agent.hello.get("host"), how))

    def _write(self, kind, data):
        fd = self._fds[kind]
        if not data or fd in self._broken:
            return
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:  # a closed pipe (ddlrun ... | head): drop the rest
            self._broken.add(fd)
