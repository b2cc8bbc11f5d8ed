"""Shared fixtures: launching scripts under mpiexec and reading their cases."""

import json
import os
import shutil
import subprocess
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
MPI_DIR = os.path.join(TESTS_DIR, "mpi")


def mpiexec_path():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    path = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if path is None:
        pytest.fail("mpiexec not found: install the mpich wheel (pip install -r requirements.txt)")
    return path


def launch_env(extra=None):
    env = dict(os.environ)
    env.update({
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONUNBUFFERED": "1",
        # A desynchronised test must end in an error, never hang the suite.
        "DDL_STALL_TIMEOUT_S": env.get("DDL_STALL_TIMEOUT_S", "60"),
        "OMP_NUM_THREADS": "1",
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "2",
    })
    env.update(extra or {})
    return env


def _launch(argv, env, timeout):
    """Runs a launcher command line; a launch that overruns fails the test
    with what it printed."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=launch_env(env), cwd=TESTS_DIR)
    except subprocess.TimeoutExpired as e:
        def text(data):  # TimeoutExpired carries bytes even with text=True
            return (data or b"").decode(errors="replace") if isinstance(data, bytes) else data
        pytest.fail(f"{' '.join(argv)} did not finish in {timeout} s\n"
                    f"stdout:\n{text(e.stdout)[-4000:]}\nstderr:\n{text(e.stderr)[-4000:]}")


def run_mpi(nprocs, script, args=(), env=None, timeout=300):
    """Runs ``python script args`` on nprocs ranks; returns CompletedProcess."""
    return _launch([mpiexec_path(), "-n", str(nprocs), sys.executable, script, *args], env,
                   timeout)


def parse_cases(proc):
    """{case: {rank: result}} from the DDLCASE lines of a launch."""
    results = {}
    decoder = json.JSONDecoder()
    text = proc.stdout
    start = text.find("DDLCASE ")
    while start >= 0:
        # Lines of different ranks can interleave; each record is parsed
        # from its marker to the end of its JSON object.
        try:
            r, end = decoder.raw_decode(text, start + len("DDLCASE "))
            results.setdefault(r["case"], {})[r["rank"]] = r
        except json.JSONDecodeError:
            end = start + 1
        start = text.find("DDLCASE ", end)
    return results


class CaseRun:
    """One launch of a case script; tests look their case up in it."""

    def __init__(self, nprocs, script, env=None, timeout=400, cases=()):
        self.nprocs = nprocs
        self.proc = run_mpi(nprocs, os.path.join(MPI_DIR, script), args=cases, env=env,
                            timeout=timeout)
        self.results = parse_cases(self.proc)

    def check(self, name):
        per_rank = self.results.get(name)
        if per_rank is None:
            pytest.fail(f"case {name} reported nothing (launch exit {self.proc.returncode})\n"
                        f"stdout tail:\n{self.proc.stdout[-3000:]}\n"
                        f"stderr tail:\n{self.proc.stderr[-3000:]}")
        missing = sorted(set(range(self.nprocs)) - set(per_rank))
        assert not missing, f"case {name}: no report from ranks {missing}"
        failures = [f"rank {r}:\n{res['detail']}" for r, res in sorted(per_rank.items())
                    if not res["ok"]]
        assert not failures, f"case {name} failed on {len(failures)} rank(s):\n" + \
            "\n".join(failures)


    def check_clean_exit(self):
        assert self.proc.returncode == 0, self.proc.stderr[-4000:]


_LAUNCHES = {}


def shared_launch(nprocs, script, env=None, cases=()):
    """One launch per (script, ranks, environment, cases) for the session,
    shared by all the tests that read its cases."""
    key = (script, nprocs, tuple(sorted((env or {}).items())), tuple(cases))
    if key not in _LAUNCHES:
        _LAUNCHES[key] = CaseRun(nprocs, script, env=env, cases=cases)
    return _LAUNCHES[key]


def case_names(script):
    """Names of the @case functions in a script, read without importing it."""
    names, pending = [], False
    with open(os.path.join(MPI_DIR, script)) as f:
        for line in f:
            if line.startswith("@case"):
                pending = True
            elif pending and line.startswith("def "):
                names.append(line[4:line.index("(")])
                pending = False
    return names


# --- the test cluster: network namespaces with shaped links ---------------

_CLUSTERS = {}


def netns_cluster(nodes, rate="1gbit"):
    """A cluster of ``nodes`` namespaces for the session (built once, torn
    down at exit); skips the test when this machine cannot build one."""
    from keras_ddl.cluster import NetnsCluster, missing_requirements
    reason = missing_requirements()
    if reason:
        pytest.skip(f"the network-namespace test cluster needs root, ip and tc: {reason}")
    cluster = _CLUSTERS.get(nodes)
    if cluster is None:
        cluster = _CLUSTERS[nodes] = NetnsCluster(nodes, rate).up()
    if cluster.rate != rate:
        cluster.set_rate(rate)
    return cluster


def pytest_sessionfinish(session, exitstatus):
    for cluster in _CLUSTERS.values():
        cluster.down()
    _CLUSTERS.clear()


def run_on_cluster(cluster, ranks_per_node, script, args=(), env=None, timeout=300):
    """Runs ``python script args`` with ``ranks_per_node`` ranks on every
    node of ``cluster``; returns (CompletedProcess, [(sent, received)] bytes
    each node's link carried during the launch)."""
    from keras_ddl.cluster import MPI_ENV
    nprocs = ranks_per_node * cluster.nodes
    argv = [mpiexec_path(), *cluster.mpiexec_args(ranks_per_node), "-n", str(nprocs),
            sys.executable, script, *args]
    before = cluster.link_bytes()
    proc = _launch(argv, dict(MPI_ENV, **(env or {})), timeout)
    after = cluster.link_bytes()
    moved = [(s1 - s0, r1 - r0) for (s0, r0), (s1, r1) in zip(before, after)]
    return proc, moved


class ClusterCaseRun(CaseRun):
    """A case script launched on the test cluster; ``link_bytes`` holds what
    each node's link carried during the launch, and every rank prints its
    traffic counters after the cases (``DDLTRAFFIC`` lines, tests/mpi/harness.py)."""

    def __init__(self, cluster, ranks_per_node, script, env=None, timeout=400, cases=()):
        self.nprocs = ranks_per_node * cluster.nodes
        self.proc, self.link_bytes = run_on_cluster(
            cluster, ranks_per_node, os.path.join(MPI_DIR, script), args=cases,
            env=dict(env or {}, DDL_TEST_REPORT_TRAFFIC="1"), timeout=timeout)
        self.results = parse_cases(self.proc)


_CLUSTER_LAUNCHES = {}


def shared_cluster_launch(nodes, ranks_per_node, script, env=None, cases=(), rate="1gbit"):
    key = (nodes, ranks_per_node, script, tuple(sorted((env or {}).items())), tuple(cases), rate)
    if key not in _CLUSTER_LAUNCHES:
        cluster = netns_cluster(nodes, rate)
        _CLUSTER_LAUNCHES[key] = ClusterCaseRun(cluster, ranks_per_node, script, env=env,
                                                cases=cases)
    return _CLUSTER_LAUNCHES[key]
