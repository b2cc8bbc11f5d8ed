"""Strangers at the probe ports: many idle connections, kept open from
outside the job (transport/probe_responder.h must neither answer them nor
let them delay the job's own probes)."""

import errno
import selectors
import socket
import subprocess
import threading
import time


def probe_ports(namespace, address):
    """The probe ports of the ranks in network namespace ``namespace``:
    ports listened on at both 127.0.0.1 and ``address`` (the responder's
    sockets; MPI's listen on the wildcard address)."""
    out = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-ltnH"], check=True,
                         capture_output=True, text=True).stdout
    seen = {}
    for line in out.splitlines():
        local = line.split()[3]
        host, _, port = local.rpartition(":")
        seen.setdefault(int(port), set()).add(host)
    return sorted(p for p, hosts in seen.items() if {"127.0.0.1", address} <= hosts)


class IdleFlood:
    """Keeps ``total`` connections open to the (address, port) ``targets``
    from this process, sending nothing; one the far end closes is opened
    again at once. ``stop()`` returns (connections opened, bytes read, the
    most open at once)."""

    def __init__(self, targets, total=1000, per_second=500):
        self.targets, self.total, self.per_second = list(targets), total, per_second
        self.opened = self.read = self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self, selector, k):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        code = s.connect_ex(self.targets[k % len(self.targets)])
        if code not in (0, errno.EINPROGRESS):
            s.close()
            return False
        selector.register(s, selectors.EVENT_READ)
        self.opened += 1
        return True

    def _run(self):
        selector = selectors.DefaultSelector()
        k = 0
        start = time.monotonic()
        while not self._stop.is_set():
            # Paced: at most per_second new connections (a flood, not a
            # loop that starves the ranks of the machine's two cores).
            allowed = int((time.monotonic() - start) * self.per_second) + self.total
            while len(selector.get_map()) < self.total and self.opened < allowed:
                k += 1
                if not self._open(selector, k):
                    time.sleep(0.01)
                    break
            self.most = max(self.most, len(selector.get_map()))
            for key, _ in selector.select(timeout=0.05):
                try:
                    data = key.fileobj.recv(4096)
                except OSError:
                    data = b""
                self.read += len(data)
                if not data:  # closed by the responder (or reset): open another
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
        for key in list(selector.get_map().values()):
            key.fileobj.close()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)
        return self.opened, self.read, self.most
