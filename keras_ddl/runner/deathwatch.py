"""Which rank died first: ddlrun's watch over the ranks on its own host.

When one rank dies, MPICH's launcher kills the others and prints one PID,
not always the one that died first. Every rank writes ``{rank, pid, host}``
into a registry directory at init (``DDL_RANK_REGISTRY``, see
``basics._register_with_launcher``); this watcher opens a pidfd for each
rank of this host as it registers and notes the order in which they exit.
A pidfd becomes readable when its process ends, so the first death is seen
microseconds after it happens, well before the launcher's clean-up kills.
Needs Linux >= 5.3 (``os.pidfd_open``); elsewhere it reports nothing. A
rank that ends before the watcher first sees its registration (20 ms
polls) is reported together with any others found ended in the same look.
"""

import json
import os
import select
import socket
import threading
import time


class DeathWatch:
    def __init__(self, registry, expected):
        self.registry = registry
        self.expected = expected  # ranks in the job (some may be on other hosts)
        self.host = socket.gethostname()
        self.deaths = []  # [(seconds since start, [ranks])] in order of exit
        self._fds = {}    # pidfd -> (rank, pid)
        self._seen = set()
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="ddlrun-deathwatch", daemon=True)

    @staticmethod
    def supported():
        return hasattr(os, "pidfd_open")

    def start(self):
        if self.supported():
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        # Ranks that registered and ended since the last look (a whole job
        # can die within one poll interval): ended, order unknown.
        if self.supported():
            self._register_new()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def _register_new(self):
        gone = []
        for name in os.listdir(self.registry):
            if name in self._seen or not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.registry, name)) as f:
                    entry = json.load(f)
            except (OSError, ValueError):
                continue  # still being written: next round
            self._seen.add(name)
            if entry.get("host") != self.host:
                continue
            try:
                fd = os.pidfd_open(int(entry["pid"]))
            except ProcessLookupError:  # ended before we looked
                gone.append(int(entry["rank"]))
                continue
            except (OSError, KeyError, ValueError):
                continue
            self._fds[fd] = (int(entry["rank"]), int(entry["pid"]))
        if gone:
            self.deaths.append((time.monotonic() - self._start, sorted(gone)))

    def _run(self):
        # Looks for new registrations every 20 ms until every rank is known
        # (a rank can die soon after init), then only waits for exits.
        while not self._stop.is_set():
            registering = len(self._seen) < self.expected
            if registering:
                self._register_new()
            if not self._fds:
                self._stop.wait(0.02)
                continue
            ready, _, _ = select.select(list(self._fds), [], [], 0.02 if registering else 0.5)
            if ready:
                now = time.monotonic() - self._start
                self.deaths.append((now, sorted(self._fds[fd][0] for fd in ready)))
                for fd in ready:
                    del self._fds[fd]
                    os.close(fd)
