"""A real Slurm on a namespace cluster: munge, slurmctld on the machine
itself (reached through the cluster's bridge), one slurmd per node inside the
node's network namespace under the node's hostname, and Slurm's
``topology/tree`` plugin written from the cluster's racks, so every task gets
``SLURM_TOPOLOGY_ADDR`` from Slurm itself.

Every file (configuration, keys, sockets, spool, logs) lives in a directory
of the cluster's own, and every daemon is started here and stopped at
``down()`` by its pid; nothing reads or writes /etc/slurm or /etc/munge.
Clients (``srun``, ``sbatch``, ``salloc``, ``squeue``) find this Slurm with
``SLURM_CONF`` (``SlurmCluster.env()``).

Each node's daemon runs in a mount namespace of its own where /etc/hosts
lists the nodes and the machine's hostname, as a real cluster's DNS would:
a task on node2 reaches ``node1`` and the host it was submitted from by name.

Needs root and Debian's ``slurmd``, ``slurmctld``, ``slurm-client`` and
``munge`` (22.05).
"""

import os
import shutil
import signal
import socket
import subprocess
import time

# The programs a Slurm cluster needs; missing_slurm() names the package.
SLURM_PROGRAMS = (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
                  ("srun", "slurm-client"), ("sbatch", "slurm-client"),
                  ("scontrol", "slurm-client"), ("sinfo", "slurm-client"))
# How long the daemons get to come up, and to stop before SIGKILL.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class SlurmError(RuntimeError):
    pass


def missing_slurm():
    """Why a Slurm cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "a Slurm test cluster needs root (slurmd runs in network namespaces)"
    for program, package in SLURM_PROGRAMS:
        if shutil.which(program) is None and not os.path.exists("/usr/sbin/" + program):
            return f"'{program}' is not installed (Debian package {package})"
    return None


def _program(name):
    return shutil.which(name) or "/usr/sbin/" + name


def _free_port():
    """A TCP port nothing on this machine listens on now, for slurmctld
    (several clusters, or a real Slurm, may run here at once)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def cgroup_conf():
    """cgroup.conf for this machine. Where the cgroup v1 controllers are
    mounted on a tmpfs at /sys/fs/cgroup (CI machines, containers), Slurm's
    autodetection fails and slurmd does not start, so v1 is named; systemd is
    ignored because no systemd runs the daemons here."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        plugin = "cgroup/v2"
    elif os.path.isdir("/sys/fs/cgroup/cpuset") or os.path.isdir("/sys/fs/cgroup/memory"):
        plugin = "cgroup/v1"
    else:
        plugin = "autodetect"
    return (f"CgroupPlugin={plugin}\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemd=yes\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n")


def slurm_conf(cluster, directory, port, cpus_per_node, controller):
    """slurm.conf text for ``cluster`` (a NetnsCluster that is up), with
    every path under ``directory`` and slurmctld at ``controller`` (this
    machine's short hostname) on ``port`` of the bridge address."""
    nodes = "\n".join(f"NodeName={host} NodeAddr={addr} CPUs={cpus_per_node} State=UNKNOWN"
                      for host, addr in zip(cluster.hosts, cluster.addresses))
    return f"""# Slurm for namespace cluster {cluster.name}; written by keras_ddl_tools.cluster.slurm
ClusterName={cluster.name}
SlurmctldHost={controller}({cluster.bridge_address})
SlurmctldPort={port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={directory}/munge.socket
StateSaveLocation={directory}/ctld
SlurmdSpoolDir={directory}/spool/%n
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd-%n.pid
SlurmctldLogFile={directory}/slurmctld.log
SlurmdLogFile={directory}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroup tracking: the nodes share one machine's cgroups, and CI's
# machines mount them in ways Slurm's cgroup plugins do not all accept.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Nodes declare the CPUs the test needs, more than this machine has.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
TopologyPlugin=topology/tree
MpiDefault=none
ReturnToService=2
# A node cut off is noticed within seconds, for requeue tests.
SlurmdTimeout=5
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=5
MinJobAge=300
RebootProgram=/bin/false
{nodes}
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def topology_conf(cluster):
    """topology.conf: one switch per rack, a core switch above them (one
    switch for a one-rack cluster). Slurm then gives each task
    SLURM_TOPOLOGY_ADDR core.rackR.nodeI, as NetnsCluster.topology_addr."""
    if cluster.racks == 1:
        return f"SwitchName=core Nodes={','.join(cluster.hosts)}\n"
    lines = []
    for r in range(cluster.racks):
        hosts = [h for h, k in zip(cluster.hosts, cluster.rack_of) if k == r]
        lines.append(f"SwitchName=rack{r + 1} Nodes={','.join(hosts)}")
    lines.append("SwitchName=core Switches=" + ",".join(f"rack{r + 1}"
                                                        for r in range(cluster.racks)))
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """Slurm daemons for a NetnsCluster that is up. ``up()`` starts them
    and waits until every node is idle; ``down()`` ends every job step's
    processes and every daemon it started. ``env()`` is what a client
    (srun, sbatch, salloc) needs in its environment."""

    def __init__(self, cluster, cpus_per_node=2):
        self.cluster = cluster
        self.cpus_per_node = int(cpus_per_node)
        self.directory = os.path.join(cluster.state_dir, "slurm")
        self.conf = os.path.join(self.directory, "slurm.conf")
        self.controller = socket.gethostname().split(".")[0]
        self.port = None
        self._daemons = []  # (what, Popen)

    def env(self):
        """Environment for Slurm's clients: this cluster's slurm.conf."""
        return {"SLURM_CONF": self.conf}

    def log(self, what):
        """The text of a daemon's log: "slurmctld", "munged" or a node name."""
        name = {"slurmctld": "slurmctld.log", "munged": "munged.log"}.get(what,
                                                                         f"slurmd-{what}.log")
        try:
            with open(os.path.join(self.directory, name), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def up(self):
        reason = missing_slurm()
        if reason:
            raise SlurmError(reason)
        os.makedirs(os.path.join(self.directory, "ctld"))
        os.makedirs(os.path.join(self.directory, "spool"))
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _write(self, name, text, mode=0o644):
        path = os.path.join(self.directory, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        return path

    def _spawn(self, what, argv):
        log = open(os.path.join(self.directory, f"{what}.out"), "w")
        # cwd /: this process's directory may not exist in a node's mounts.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self._daemons.append((what, proc))
        # Recorded for the stale-cluster sweep (a run killed before down()).
        with open(os.path.join(self.directory, "pids"), "a") as f:
            f.write(f"{proc.pid}\n")
        return proc

    def _start(self):
        # munge: a key of this cluster's own; the daemon refuses to run as
        # root or with a world-readable directory unless forced.
        os.chmod(self.directory, 0o700)
        self._write("munge.key", os.urandom(128).hex(), mode=0o400)
        self._spawn("munged", [_program("munged"), "--foreground", "--force",
                               f"--socket={self.directory}/munge.socket",
                               f"--key-file={self.directory}/munge.key",
                               f"--pid-file={self.directory}/munged.pid",
                               f"--log-file={self.directory}/munged.log",
                               f"--seed-file={self.directory}/munged.seed"])
        self._wait(lambda: os.path.exists(f"{self.directory}/munge.socket"), "munged")
        self.port = _free_port()
        self._write("slurm.conf", slurm_conf(self.cluster, self.directory, self.port,
                                             self.cpus_per_node, self.controller))
        self._write("topology.conf", topology_conf(self.cluster))
        self._write("cgroup.conf", cgroup_conf())
        # Every node resolves the others and this machine by name.
        self._write("hosts", "127.0.0.1 localhost\n" + "".join(
            f"{addr} {host}\n" for host, addr in zip(self.cluster.hosts,
                                                      self.cluster.addresses))
            + f"{self.cluster.bridge_address} {self.controller}\n")
        # The directory must be reachable by the job's tasks (they run as
        # root here, but sbatch scripts are read by slurmd from the spool).
        os.chmod(self.directory, 0o755)
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", self.conf])
        self._wait(self._controller_answers, "slurmctld")
        for node, host in enumerate(self.cluster.hosts):
            os.makedirs(os.path.join(self.directory, "spool", host))
            self.start_slurmd(node)
        self._wait(self._all_idle, "slurmd on every node")

    def start_slurmd(self, node):
        """Starts node ``node``'s (0-based) slurmd: at ``up()``, and again
        after a test took the node down (its processes killed)."""
        host, ns = self.cluster.hosts[node], self.cluster.namespaces[node]
        # ip netns exec: the node's network; unshare -u -m: its hostname and
        # its /etc/hosts, private to its processes and its jobs'. /tmp stays
        # the machine's: it stands for the shared file system the nodes of a
        # real cluster mount, and the job's Python may live there (a venv
        # made by mktemp, as .ci/run makes it). Slurm's PMIx plugin, which
        # makes per-step directories in /tmp under names that collide
        # between nodes sharing it, is therefore not usable on this cluster
        # (nor is it with the mpich wheel: docs/multinode.md).
        inner = (f"mount --bind {self.directory}/hosts /etc/hosts && hostname {host} && "
                 f"exec {_program('slurmd')} -D -N {host} -f {self.conf}")
        self._spawn(f"slurmd-{host}", ["ip", "netns", "exec", ns, "unshare", "-u", "-m",
                                      "--propagation", "private", "sh", "-c", inner])

    def _wait(self, ready, what):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in self._daemons:
                if proc.poll() is not None:
                    raise SlurmError(f"{name} exited with {proc.returncode} while starting; "
                                     f"its output:\n{self._output(name)}")
            if ready():
                return
            time.sleep(0.25)
        raise SlurmError(f"{what} not ready after {START_TIMEOUT_S:g} s; slurmctld's log:\n"
                         + self.log("slurmctld")[-3000:])

    def _output(self, name):
        try:
            with open(os.path.join(self.directory, f"{name}.out"), errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        log = self.log(name.replace("slurmd-", ""))
        return (text + log)[-3000:]

    def run(self, *argv, timeout=60, check=True):
        """Runs a Slurm client (``scontrol``, ``sinfo`` ...) against this
        cluster; its CompletedProcess."""
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **self.env()))
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({proc.returncode}): "
                             f"{proc.stderr.strip()}")
        return proc

    def _controller_answers(self):
        try:
            return self.run("scontrol", "ping", timeout=10, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def node_states(self):
        """{node: state} as sinfo reports it (idle, alloc, down*, ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def _all_idle(self):
        try:
            states = self.node_states()
        except subprocess.TimeoutExpired:
            return False
        return all(states.get(h) == "idle" for h in self.cluster.hosts)

    def down(self):
        """Stops every daemon this cluster started: SIGTERM to all at once,
        SIGKILL to those still running after STOP_TIMEOUT_S. (The cluster
        kills what runs in its nodes first: job steps, and slurmd, which
        waits for them.) Safe to call twice."""
        procs = [proc for _, proc in self._daemons]
        self._daemons = []
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _signal_group(proc, signum):
    """``signum`` to a daemon's process group (its session: sh, slurmd ...)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def kill_recorded_daemons(state_dir):
    """SIGKILLs the daemons a killed run left (their pids in the cluster's
    state directory), so a stale cluster's teardown leaves no slurmd.
    Returns whether the cluster ran Slurm."""
    try:
        with open(os.path.join(state_dir, "slurm", "pids")) as f:
            pids = [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return False
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return True
