"""A cluster of network namespaces on one Linux machine, for trying and
testing multi-node runs without servers.

Each node is a network namespace joined to a Linux bridge by a veth pair;
`tc tbf` on both ends of the pair caps the node's link at the given rate in
each direction. With racks, each rack is a bridge of its own (its nodes'
top-of-rack switch) and reaches a core bridge through one veth pair, the
rack's uplink, shaped the same way at its own rate; every node is then told
its place as Slurm's topology plugin would (SLURM_TOPOLOGY_ADDR
``core.rackR.nodeI``, SLURM_TOPOLOGY_ADDR_PATTERN ``switch.switch.node``). Ranks are started in a node by an ssh stand-in script that
MPICH's launcher runs in place of ssh (``mpiexec -launcher ssh
-launcher-exec STANDIN``): it enters the node's namespace and sets the
node's hostname in a UTS namespace of its own (``unshare -u``), so
``MPI_COMM_TYPE_SHARED`` and ``socket.gethostname()`` see one host per node.
With ``shm``, each node also gets a /dev/shm of its own of that size (a
tmpfs in a mount namespace of its own, ``unshare -m``), as a container
does (Docker and Kubernetes give 64 MiB unless told otherwise).

Names are unique per cluster (``kd`` + 5 hex digits), so several clusters
can exist at once. A cluster records its owner's pid; a cluster whose owner
died (a crashed or killed run) is removed by the next ``NetnsCluster.up``.
Addresses come from 198.18.0.0/15, the range reserved for benchmarking
(RFC 2544); nothing else is ever a target. Needs root, ``ip`` and ``tc``.
"""

import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys

from keras_ddl_tools import rates

from .slurm import SlurmCluster, kill_recorded_daemons

STATE_ROOT = "/run/keras_ddl_cluster"
BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
# The launcher's stand-in talks to MPI over TCP through the links; UCX would
# otherwise move traffic between namespaces of one machine through shared
# memory, and the links would carry nothing.
MPI_ENV = {"UCX_TLS": "tcp,self"}

# Namespaces this module makes: cluster name (kd + 5 hex digits), -n, node.
OUR_NAMESPACE = re.compile(r"^(kd[0-9a-f]{5})-n[0-9]+$")


class ClusterError(RuntimeError):
    pass


def _byte_counters(device):
    """(transmitted, received) bytes of a network device, from sysfs."""
    base = f"/sys/class/net/{device}/statistics/"
    with open(base + "tx_bytes") as f:
        transmitted = int(f.read())
    with open(base + "rx_bytes") as f:
        received = int(f.read())
    return transmitted, received


def parse_rate(text):
    """'100mbit', '1gbit', '10gbit' -> bits per second (ClusterError if not)."""
    try:
        return rates.parse_rate(text)
    except ValueError as e:
        raise ClusterError(str(e)) from None


# How long a packet may wait in an uplink's queue before tbf drops it. A
# top-of-rack switch's buffer is shallow, and a deep one starves a
# direction: with every node of 2 racks x 4 streaming to its peer in the
# other rack (probe.py), one direction reached 0.95 of the uplink and the
# other 0.12-0.44 in 3 of 4 probes with the node links' 100 ms queue, 1 of
# 4 with 5-10 ms, 0 of 3 with 2 ms (loaded machine, load 8-11 on 2 cores):
# that direction's ACKs wait behind the other's data. This kernel has no
# fair queueing (only tbf and pfifo), so the queue is kept short instead.
UPLINK_QUEUE = "2ms"

# The smallest token bucket a link may have: one Ethernet frame. Below it
# tbf could never send a frame.
MIN_BURST_BYTES = 1600


def default_burst(rate_bps):
    """Bytes a link's token bucket holds unless told: 2 ms at the rate, and
    at least 256 KB. After an idle moment those bytes leave at the veth's
    own speed, so a call that sends up to about this much per link is
    faster than the rate allows (docs/performance-notes/2026-12-04-token-bucket.md).
    A 64 KB bucket at 1 Gbit/s cost a 16 MB allreduce a tenth of its speed
    at 2 nodes x 1 rank and a fifth at 2 x 2 on a 2-core machine, probably
    because ranks sharing cores leave gaps in sending that a small bucket
    cannot make up later."""
    return max(256 * 1024, int(rate_bps / 8 * 0.002))


def parse_burst(text, rate_bps):
    """``--burst`` text -> bytes (None: the default for the rate)."""
    if text is None:
        return default_burst(rate_bps)
    try:
        burst = rates.parse_size(text, "burst")
    except ValueError as e:
        raise ClusterError(str(e)) from None
    if burst < MIN_BURST_BYTES:
        raise ClusterError(f"burst={text!r}: the bucket must hold at least one frame "
                           f"({MIN_BURST_BYTES} bytes)")
    return burst


def find_mpiexec():
    """The mpiexec beside this Python (the mpich wheel's), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(beside):
        return beside
    found = shutil.which("mpiexec")
    if found is None:
        raise ClusterError("mpiexec not found: install the mpich wheel or put your MPI's bin/ "
                           "on PATH")
    return found


def missing_requirements():
    """Why a cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (iproute2 / util-linux)"
    return None


def _run(*argv, check=True):
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NetnsCluster:
    """``nodes`` namespaces behind one bridge, each link capped at ``rate``.

    Use as a context manager (torn down on exit, also on an exception or
    SIGTERM) or call ``up()`` / ``down()``. ``hosts`` are the node names to
    give the launcher (``node1`` ...); ``standin`` is the ssh stand-in."""

    def __init__(self, nodes, rate="1gbit", name=None, burst=None, racks=1, uplink=None,
                 tell_topology=True, shm=None, slurm=False, slurm_cpus=2):
        """``nodes`` per rack (``racks`` of them; ``nodes`` is the total
        with one rack). ``uplink``: each rack's link to the core, each way
        (default: ``rate``); its token bucket is the default for its rate.
        ``tell_topology``: with racks, every node is told its place as
        Slurm tells it; False tells nothing, as most jobs run (hosts are
        still listed rack by rack). ``shm``: the size of each node's own
        /dev/shm ("64m", as tmpfs's ``size=``; None: the machine's, shared
        by every node). ``slurm``: also run a Slurm on the cluster (slurm.py;
        ``self.slurm`` once up) whose nodes declare ``slurm_cpus`` CPUs."""
        if int(nodes) != nodes or nodes < 1:
            raise ClusterError(f"nodes={nodes!r}: expected a whole number >= 1")
        if int(racks) != racks or racks < 1:
            raise ClusterError(f"racks={racks!r}: expected a whole number >= 1")
        self.racks = int(racks)
        self.tell_topology = bool(tell_topology)
        self.nodes_per_rack = int(nodes)
        self.nodes = int(nodes) * self.racks
        self.uplink = uplink if uplink is not None else rate
        self.uplink_bps = parse_rate(self.uplink)
        self.uplink_burst = default_burst(self.uplink_bps)
        self.rate_bps = parse_rate(rate)
        self.rate = rate
        self.burst_text = burst
        self.burst = parse_burst(burst, self.rate_bps)
        if shm is not None and not re.fullmatch(r"[0-9]+[kmg]?", str(shm)):
            raise ClusterError(f"shm={shm!r}: expected a size such as 64m or 1g")
        self.shm = shm
        self.name = name or "kd" + secrets.token_hex(3)[:5]
        self.state_dir = os.path.join(STATE_ROOT, self.name)
        # The bridge holding this machine's address (-iface for the
        # launcher): the only one, or the core bridge with racks.
        self.bridge = self.name + ("b" if self.racks == 1 else "c")
        self.rack_bridges = [f"{self.name}b{r + 1}" for r in range(self.racks)] \
            if self.racks > 1 else [self.bridge]
        # Each uplink: rack side (on the rack bridge), core side.
        self.uplinks = [(f"{self.name}u{r + 1}", f"{self.name}k{r + 1}")
                        for r in range(self.racks)] if self.racks > 1 else []
        self.hosts = [f"node{i + 1}" for i in range(self.nodes)]
        # 0-based rack of each node: racks are consecutive runs of nodes.
        self.rack_of = [i // self.nodes_per_rack for i in range(self.nodes)]
        self.namespaces = [f"{self.name}-n{i + 1}" for i in range(self.nodes)]
        self.host_veths = [f"{self.name}v{i + 1}" for i in range(self.nodes)]
        self.addresses = []
        self.bridge_address = None
        self.standin = os.path.join(self.state_dir, "ssh-standin")
        self.slurm = SlurmCluster(self, slurm_cpus) if slurm else None
        self._old_sigterm = None
        self._is_up = False

    # -- lifecycle ---------------------------------------------------------

    def up(self):
        reason = missing_requirements()
        if reason:
            raise ClusterError(reason)
        remove_stale_clusters()
        os.makedirs(self.state_dir, exist_ok=False)
        with open(os.path.join(self.state_dir, "owner"), "w") as f:
            f.write(str(os.getpid()))
        self._is_up = True
        try:
            self._build()
            if self.slurm is not None:
                self.slurm.up()
        except BaseException:
            self.down()
            raise
        self._catch_sigterm()
        return self

    def _build(self):
        subnet = _free_subnet(self.name)
        ips = list(subnet.hosts())
        self.bridge_address = str(ips[0])
        self.addresses = [str(ips[10 + i]) for i in range(self.nodes)]
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.bridge_address}/{subnet.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        # Racks: one bridge each, joined to the core bridge by its uplink.
        # All of it is one layer-2 network, one subnet.
        for rack_bridge, (rack_side, core_side) in zip(self.rack_bridges, self.uplinks):
            _run("ip", "link", "add", rack_bridge, "type", "bridge")
            _run("ip", "link", "set", rack_bridge, "up")
            _run("ip", "link", "add", rack_side, "type", "veth", "peer", "name", core_side)
            _run("ip", "link", "set", rack_side, "master", rack_bridge, "up")
            _run("ip", "link", "set", core_side, "master", self.bridge, "up")
        for i, (ns, veth, addr) in enumerate(zip(self.namespaces, self.host_veths,
                                                 self.addresses)):
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.rack_bridges[self.rack_of[i]], "up")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/{subnet.prefixlen}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        self.set_rate(self.rate)
        self._write_standin()
        with open(os.path.join(self.state_dir, "hosts"), "w") as f:
            for host, addr, ns in zip(self.hosts, self.addresses, self.namespaces):
                f.write(f"{host} {addr} {ns}\n")

    def down(self):
        """Removes everything this cluster made; safe to call twice."""
        if not self._is_up:
            return
        self._is_up = False
        if self.slurm is not None:
            # Job steps outlive slurmd (slurmstepd runs on its own), and
            # slurmd waits for them: everything in the nodes goes first.
            for node in range(self.nodes):
                self.kill_processes(node)
            self.slurm.down()
        _teardown(self.name, self.nodes)
        if self._old_sigterm is not None:
            try:
                signal.signal(signal.SIGTERM, self._old_sigterm)
            except ValueError:
                pass
            self._old_sigterm = None

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    def _catch_sigterm(self):
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except ValueError:
            return

        def on_term(signum, frame):
            self.down()
            if callable(previous):
                previous(signum, frame)
            raise SystemExit(128 + signum)

        try:
            signal.signal(signal.SIGTERM, on_term)
            self._old_sigterm = previous
        except ValueError:  # not the main thread: rely on the stale-cluster sweep
            pass

    # -- links -------------------------------------------------------------

    def set_rate(self, rate):
        """Caps every link at ``rate`` in both directions (tc tbf), with the
        bucket given at construction (``burst``) or the rate's default."""
        bps = parse_rate(rate)
        self.rate, self.rate_bps = rate, bps
        self.burst = burst = parse_burst(self.burst_text, bps)
        # tbf splits a segmentation-offload packet larger than the bucket
        # into frames, so a small bucket still passes 64 KB packets.
        shape = ["root", "tbf", "rate", f"{int(bps)}bit", "burst", str(burst), "latency", "100ms"]
        for ns, veth in zip(self.namespaces, self.host_veths):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", *shape)
            _run("tc", "qdisc", "replace", "dev", veth, *shape)
        self.set_uplink(self.uplink)

    def set_uplink(self, rate):
        """Caps every rack's uplink at ``rate`` in both directions, with
        the default token bucket for that rate (no-op with one rack)."""
        bps = parse_rate(rate)
        self.uplink, self.uplink_bps = rate, bps
        self.uplink_burst = default_burst(bps)
        shape = ["root", "tbf", "rate", f"{int(bps)}bit", "burst", str(self.uplink_burst),
                 "latency", UPLINK_QUEUE]
        for rack_side, core_side in self.uplinks:
            _run("tc", "qdisc", "replace", "dev", rack_side, *shape)
            _run("tc", "qdisc", "replace", "dev", core_side, *shape)

    def set_link(self, node, up):
        """Takes node ``node`` (0-based) off the bridge (up=False) or back."""
        _run("ip", "link", "set", self.host_veths[node], "up" if up else "down")

    def processes(self, node):
        """Pids of the processes in node ``node``'s (0-based) namespace."""
        out = _run("ip", "netns", "pids", self.namespaces[node], check=False).stdout
        return [int(pid) for pid in out.split()]

    def kill_processes(self, node):
        """SIGKILLs every process in node ``node``'s namespace: what is left
        of a job on a node that was cut off for good (a namespace outlives
        its name while processes run in it)."""
        for pid in self.processes(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def link_bytes(self):
        """[(sent, received)] bytes of each node's link, as counted by the
        bridge side of its veth (what it receives, the node sent)."""
        return [tuple(reversed(_byte_counters(veth))) for veth in self.host_veths]

    def uplink_bytes(self):
        """[(out, in)] bytes of each rack's uplink: leaving the rack for the
        core, and arriving from it (counted on the uplink's rack side)."""
        return [_byte_counters(rack_side) for rack_side, _ in self.uplinks]

    def topology_addr(self, node):
        """SLURM_TOPOLOGY_ADDR of node ``node`` (0-based), as Slurm's tree
        topology writes it: switches from the core down, then the node."""
        return f"core.rack{self.rack_of[node] + 1}.{self.hosts[node]}"

    def ddl_topology(self):
        """The same racks as a DDL_TOPOLOGY value (docs/topology.md)."""
        return ";".join(
            f"rack{r + 1}=" + ",".join(h for h, k in zip(self.hosts, self.rack_of) if k == r)
            for r in range(self.racks))

    # -- launching ---------------------------------------------------------

    def _write_standin(self):
        # With racks the stand-in also exports the node's place, as Slurm
        # does for every task of a job (unless told not to).
        def topology(i):
            if self.racks == 1 or not self.tell_topology:
                return ""
            return (f" export SLURM_TOPOLOGY_ADDR={self.topology_addr(i)}"
                    f" SLURM_TOPOLOGY_ADDR_PATTERN=switch.switch.node;")
        cases = "\n".join(
            f"  {host}|{addr}) ns={ns}; name={host};{topology(i)};"
            for i, (host, addr, ns) in enumerate(zip(self.hosts, self.addresses,
                                                      self.namespaces)))
        # The node's own /dev/shm: a mount namespace per launch on the node
        # (one launcher proxy per node, so the node's ranks share it).
        if self.shm is None:
            standin_exec = 'exec ip netns exec "$ns" unshare -u sh -c "hostname $name; exec $*"'
        else:
            standin_exec = ('exec ip netns exec "$ns" unshare -u -m sh -c "mount -t tmpfs -o '
                            f'size={self.shm} tmpfs /dev/shm && hostname $name && exec $*"')
        script = f"""#!/bin/sh
# ssh stand-in for cluster {self.name}: ssh [options] HOST COMMAND...
# runs COMMAND in HOST's network namespace under HOST's hostname.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2;;
    -*) shift;;
    *) break;;
  esac
done
host=$1; shift
case "$host" in
{cases}
  *) echo "ssh-standin ({self.name}): unknown host '$host'" >&2; exit 255;;
esac
{standin_exec}
"""
        with open(self.standin, "w") as f:
            f.write(script)
        os.chmod(self.standin, 0o755)

    def mpiexec_args(self, ranks_per_node):
        """The launcher options that place ``ranks_per_node`` ranks on
        every node (prepend the mpiexec path, append -n and the command)."""
        return ["-launcher", "ssh", "-launcher-exec", self.standin, "-iface", self.bridge,
                "-hosts", ",".join(f"{h}:{ranks_per_node}" for h in self.hosts)]


def _free_subnet(name):
    """A /24 of 198.18.0.0/15 that no interface here uses yet."""
    used = set()
    for line in _run("ip", "-4", "-o", "addr", check=False).stdout.splitlines():
        for word in line.split():
            if "/" in word and word[0].isdigit():
                used.add(ipaddress.ip_interface(word).network)
    subnets = list(BENCH_NET.subnets(new_prefix=24))
    start = int(name[2:], 16) % len(subnets)
    for k in range(len(subnets)):
        candidate = subnets[(start + k) % len(subnets)]
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise ClusterError("no free /24 left in 198.18.0.0/15")


def _teardown(name, nodes=None):
    state_dir = os.path.join(STATE_ROOT, name)
    namespaces = [ns for ns in _list_namespaces() if ns.startswith(name + "-n")]
    if kill_recorded_daemons(state_dir):  # and the job steps they left in the nodes
        for ns in namespaces:
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for ns in namespaces:
        _run("ip", "netns", "del", ns, check=False)  # removes the veth pair with it
    # Bridges (one, or a core and one per rack) and uplinks: every link
    # named after the cluster (deleting one end of a veth pair deletes both).
    for link in _list_links():
        if re.fullmatch(re.escape(name) + r"[bcuk][0-9]*", link):
            _run("ip", "link", "del", link, check=False)
    shutil.rmtree(state_dir, ignore_errors=True)


def _list_links():
    out = _run("ip", "-o", "link", "show", check=False).stdout
    # "7: kd12345u1@kd12345k1: <...>": the name before any '@peer'.
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
            if line.count(":") >= 2]


def _list_namespaces():
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale_clusters():
    """Removes clusters whose owning process is gone (a crashed run)."""
    if not os.path.isdir(STATE_ROOT):
        os.makedirs(STATE_ROOT, exist_ok=True)
    known = set()
    for name in os.listdir(STATE_ROOT):
        known.add(name)
        try:
            with open(os.path.join(STATE_ROOT, name, "owner")) as f:
                owner = int(f.read())
        except (OSError, ValueError):
            owner = None
        if owner is None or not _pid_alive(owner):
            _teardown(name)
    # Namespaces of ours without a state directory (killed mid-build).
    for ns in _list_namespaces():
        match = OUR_NAMESPACE.match(ns)
        if match and match.group(1) not in known:
            _teardown(match.group(1))
