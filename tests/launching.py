"""How the tests start jobs: ``Launcher`` launches scripts under mpiexec,
ddlrun or the network-namespace test cluster, and reads their per-case
reports (tests/conftest.py makes one for the session: the ``launcher``
fixture, which tests/mpi and tests/cluster use).

Scripts named without a directory are the ones in tests/mpi/scripts/;
launches run from tests/ in ``Launcher.env()`` (quiet TensorFlow, one thread
per op, a stall timeout, so a desynchronised test ends in an error, never a
hang), and one that overruns its timeout fails its test with what it
printed.

A case script declares its cases: its ``@case`` functions (run by
tests/mpi/scripts/harness.py's ``run_cases``), or, for a script with a
hand-written ``main()``, a ``CASES`` tuple of string literals naming every
case it reports. ``case_names`` reads them without importing the script, the
pytest files parametrize over them, and a launch that reports a case its
script does not declare fails every test that reads it.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SCRIPTS_DIR = os.path.join(TESTS_DIR, "mpi", "scripts")


def script_path(script):
    """A script's path: a bare name is a file of tests/mpi/scripts/."""
    return script if os.path.dirname(script) else os.path.join(SCRIPTS_DIR, script)


def declared_cases(path):
    """(names of the ``@case`` functions, names in the ``CASES`` table or
    None when there is none) of a case script, from its syntax tree."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    functions = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                 and any(getattr(d, "id", None) == "case" for d in node.decorator_list)]
    table = None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "CASES"):
            # A literal: the names must be readable without running the script.
            table = list(ast.literal_eval(node.value))
    return functions, table


def case_names(script):
    """Every case a script declares (tests are parametrized with them at
    collection)."""
    functions, table = declared_cases(script_path(script))
    return functions + (table or [])


def output(proc):
    """A finished launch for an assertion's message: its exit code and the
    tails of what it printed."""
    return (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
            f"stderr:\n{proc.stderr[-4000:]}")


class CaseRun:
    """One launch of a case script; tests look their case up in it.
    ``link_bytes``: on the test cluster, what each node's link carried
    during the launch (None elsewhere)."""

    def __init__(self, nprocs, proc, script, link_bytes=None):
        self.nprocs = nprocs
        self.proc = proc
        self.link_bytes = link_bytes
        self.results = Launcher.parse_cases(proc)
        # A case the script reports but does not declare would never be
        # collected, so never checked: the launch fails instead.
        self.undeclared = sorted(set(self.results) - set(case_names(script)))

    def check(self, name):
        assert not self.undeclared, (f"the launch reported cases its script does not declare "
                                     f"(add them to its CASES): {self.undeclared}")
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


class LiveLaunch:
    """A launch whose output is read line by line as it comes (for tests
    that act on the cluster while the ranks run): ``out`` and ``err`` are
    the lines so far; ``on_line`` sees every stdout line as it arrives."""

    def __init__(self, argv, env, cwd=TESTS_DIR, on_line=None):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=cwd)
        self.out, self.err = [], []
        self._on_line = on_line
        # readline, not iteration: iterating a pipe buffers, and the tests
        # must see each line when the rank writes it.
        self._readers = [threading.Thread(target=self._read, args=(pipe, lines), daemon=True)
                         for pipe, lines in ((self.proc.stdout, self.out),
                                             (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe, lines):
        for line in iter(pipe.readline, ""):
            lines.append(line)
            if self._on_line is not None and lines is self.out:
                self._on_line(line)

    def count(self, marker):
        """How many stdout lines so far contain ``marker``."""
        return sum(marker in line for line in list(self.out))

    def wait(self, timeout):
        """The exit code, or None when the launch overran ``timeout`` seconds
        (it is killed); the readers have drained both pipes either way."""
        try:
            code = self.proc.wait(timeout=max(1, timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def stdout(self):
        return "".join(self.out)

    def stderr(self):
        return "".join(self.err)

    def report(self):
        return (f"exit {self.proc.returncode}\nstdout:\n{self.stdout()[-3000:]}\n"
                f"stderr:\n{self.stderr()[-5000:]}")


class Launcher:
    """Every way the tests start a job. One per session: it keeps the case
    launches that several tests share, and the test clusters it built (torn
    down when the session ends)."""

    def __init__(self):
        self._case_runs = {}
        self._clusters = {}

    # --- what a launch is made of -------------------------------------------

    @staticmethod
    def mpiexec():
        """The mpiexec beside the interpreter, else the one on PATH."""
        beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        path = beside if os.path.exists(beside) else shutil.which("mpiexec")
        if path is None:
            pytest.fail("mpiexec not found: install the mpich wheel "
                        "(pip install -r requirements.txt)")
        return path

    @staticmethod
    def env(extra=None):
        """This process's environment with the launch settings, then ``extra``."""
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

    @staticmethod
    def cluster_env(extra=None):
        """``env`` with the MPI settings the test cluster needs (TCP between
        namespaces), then ``extra``."""
        from keras_ddl_tools.cluster import MPI_ENV
        return Launcher.env(dict(MPI_ENV, **(extra or {})))

    @staticmethod
    def python(script, *args):
        """``python script args``; ``script`` is a file of tests/mpi/scripts/, any
        path, or ``-m`` (the module is the first of ``args``)."""
        if not script.startswith("-"):
            script = script_path(script)
        return [sys.executable, script, *args]

    def mpi_argv(self, nprocs, script, *args):
        return [self.mpiexec(), "-n", str(nprocs), *self.python(script, *args)]

    def cluster_argv(self, cluster, ranks_per_node, script, *args):
        """mpiexec of ``ranks_per_node`` ranks on every node of ``cluster``."""
        return [self.mpiexec(), *cluster.mpiexec_args(ranks_per_node), "-n",
                str(ranks_per_node * cluster.nodes), *self.python(script, *args)]

    # --- launches -------------------------------------------------------------

    def command(self, argv, env=None, timeout=300, cwd=TESTS_DIR):
        """Runs ``argv`` in ``env(env)``; returns the CompletedProcess (text)."""
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  env=self.env(env), cwd=cwd)
        except subprocess.TimeoutExpired as e:
            def text(data):  # TimeoutExpired carries bytes even with text=True
                return (data or b"").decode(errors="replace") if isinstance(data, bytes) else data
            pytest.fail(f"{' '.join(map(str, argv))} did not finish in {timeout} s\n"
                        f"stdout:\n{text(e.stdout)[-4000:]}\nstderr:\n{text(e.stderr)[-4000:]}")

    def mpi(self, nprocs, script, *args, env=None, timeout=300, cwd=TESTS_DIR):
        """``mpiexec -n nprocs python script args``."""
        return self.command(self.mpi_argv(nprocs, script, *args), env=env, timeout=timeout,
                            cwd=cwd)

    def ddlrun(self, nprocs, script, *args, options=(), env=None, timeout=300, cwd=TESTS_DIR,
               module="keras_ddl_launcher.ddlrun"):
        """``ddlrun -np nprocs options python script args`` (``module``: the
        runner's module, or ``keras_ddl_launcher``, the console script's).
        The result's ``ended`` is when ddlrun returned (time.time())."""
        argv = [sys.executable, "-m", module, "-np", str(nprocs), *options,
                *self.python(script, *args)]
        proc = self.command(argv, env=env, timeout=timeout, cwd=cwd)
        proc.ended = time.time()
        return proc

    def cluster(self, nodes, rate="1gbit"):
        """A cluster of ``nodes`` namespaces for the session (built once);
        skips the test when this machine cannot build one."""
        from keras_ddl_tools.cluster import NetnsCluster, missing_requirements
        reason = missing_requirements()
        if reason:
            pytest.skip(f"the network-namespace test cluster needs root, ip and tc: {reason}")
        cluster = self._clusters.get(nodes)
        if cluster is None:
            cluster = self._clusters[nodes] = NetnsCluster(nodes, rate).up()
        if cluster.rate != rate:
            cluster.set_rate(rate)
        return cluster

    def on_cluster(self, cluster, ranks_per_node, script, *args, env=None, timeout=300,
                   counters="link_bytes"):
        """Runs ``python script args`` with ``ranks_per_node`` ranks on every
        node of ``cluster``; returns (CompletedProcess, [(sent, received)]
        bytes each of the cluster's ``counters`` (``link_bytes``: the
        nodes' links, ``uplink_bytes``: the racks' uplinks) moved meanwhile)."""
        from keras_ddl_tools.cluster import MPI_ENV
        argv = self.cluster_argv(cluster, ranks_per_node, script, *args)
        read = getattr(cluster, counters)
        before = read()
        proc = self.command(argv, env=dict(MPI_ENV, **(env or {})), timeout=timeout)
        after = read()
        return proc, [(s1 - s0, r1 - r0) for (s0, r0), (s1, r1) in zip(before, after)]

    # --- case scripts (tests/mpi/scripts/harness.py) -----------------------------------

    @staticmethod
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

    def cases(self, nprocs, script, env=None, cases=(), timeout=400):
        """A CaseRun of ``script`` on ``nprocs`` ranks (only ``cases`` if
        given): one launch per (script, ranks, environment, cases) for the
        session, shared by all the tests that read its cases."""
        self._check_selection(script, cases)
        key = ("mpi", script, nprocs, tuple(sorted((env or {}).items())), tuple(cases))
        if key not in self._case_runs:
            proc = self.mpi(nprocs, script, *cases, env=env, timeout=timeout)
            self._case_runs[key] = CaseRun(nprocs, proc, script)
        return self._case_runs[key]

    def cluster_cases(self, nodes, ranks_per_node, script, env=None, cases=(), rate="1gbit",
                      timeout=400):
        """``cases`` on the test cluster (shared like ``cases``): the CaseRun's
        ``link_bytes`` holds what each node's link carried, and every rank
        prints its traffic counters after the cases (``DDLTRAFFIC`` lines)."""
        self._check_selection(script, cases)
        key = ("cluster", nodes, ranks_per_node, script, tuple(sorted((env or {}).items())),
               tuple(cases), rate)
        if key not in self._case_runs:
            cluster = self.cluster(nodes, rate)
            proc, moved = self.on_cluster(cluster, ranks_per_node, script, *cases,
                                          env=dict(env or {}, DDL_TEST_REPORT_TRAFFIC="1"),
                                          timeout=timeout)
            self._case_runs[key] = CaseRun(ranks_per_node * cluster.nodes, proc, script, moved)
        return self._case_runs[key]

    @staticmethod
    def _check_selection(script, cases):
        """A chosen subset of a script's cases names cases it declares."""
        unknown = sorted(set(cases) - set(case_names(script)))
        assert not unknown, f"{script} declares no cases {unknown}"

    def close(self):
        for cluster in self._clusters.values():
            cluster.down()
        self._clusters.clear()
