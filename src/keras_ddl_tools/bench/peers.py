"""Side by side with Horovod: ``python -m keras_ddl.bench peers``.

This one file is the script both peers run. The command launches it twice
under mpiexec, each time with a different Python environment:

- Horovod's (``--horovod-python``, e.g. a venv with Horovod 0.28.1 and
  TensorFlow 2.15, docs/horovod.md), where it imports ``horovod.tensorflow as hvd``;
- keras_ddl's (the Python running the command), where it imports
  ``keras_ddl.horovod.tensorflow as hvd``, keras_ddl's Horovod front door.

Every launch also times MPICH's ``MPI_Allreduce`` through mpi4py, interleaved
with the ``hvd`` calls in the same processes: each peer's ratio to MPICH is
taken within its own launch, and keras_ddl over Horovod is the ratio of two
launches made one after the other.

Cases, float32, in nccl-tests' columns (size, count, type, redop, time, algbw,
busbw, wrong):

- ``hvd.allreduce`` called eagerly, op=Sum, 4 KB ... 64 MB;
- a chain of dependent 4 KB allreduces (op=Average, each call's input the
  previous call's output) in one ``tf.function``: time per call;
- ResNet-50's gradient list (the 214 trainable weights of Keras 3's
  ``ResNet50(weights=None)``, 97.6 MB) in one ``tf.function``, once as an
  allreduce per tensor and once as one ``grouped_allreduce``; the baseline
  is an ``MPI_Allreduce`` per tensor.

Horovod's environment has neither Keras 3 nor keras_ddl: keras_ddl's Python
writes the gradient shapes to a JSON file that both launches read, and at
module level this file imports only the standard library, so Horovod's
Python can run it as a plain script. ``wrong`` counts elements that differ
from the exact result (the inputs are small integers, exact in any order of
additions).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

FRONT_DOORS = {"horovod": "horovod.tensorflow", "keras_ddl": "keras_ddl.horovod.tensorflow"}
DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
CHAIN_BYTES = 4 << 10
# Columns of the per-peer tables (nccl-tests' first eight, then the baseline).
COLUMNS = ["method", "size", "count", "type", "redop", "time_us", "algbw_GBps", "busbw_GBps",
           "mpi_us", "vs_mpi", "wrong"]
SIDE_COLUMNS = ["method", "mpi_us", "horovod_us", "keras_ddl_us", "horovod/mpi",
                "keras_ddl/mpi", "keras_ddl_speedup", "wrong"]
NO_HOROVOD = ("no --horovod-python given: the Horovod rows are skipped (build Horovod in its "
              "own venv as docs/horovod.md says, then pass its bin/python)")


# --- the orchestrating process (keras_ddl's Python, no MPI) ---------------------------------

def add_arguments(parser):
    parser.add_argument("--horovod-python", metavar="PATH",
                        help="Python of an environment with Horovod (e.g. "
                             "~/venvs/horovod/bin/python, built as docs/horovod.md says); "
                             "without it the Horovod rows are skipped, saying why")
    parser.add_argument("--sizes", help="comma-separated byte counts of the eager calls "
                                        "(default 4 KB ... 64 MB)")
    parser.add_argument("--reps", type=int, default=7,
                        help="interleaved repetitions of each case (default 7)")
    parser.add_argument("--chain", type=int, default=20,
                        help="dependent 4 KB calls in the tf.function chain (default 20)")
    parser.add_argument("--gradient-tensors", type=int, default=None,
                        help="only the first N tensors of the ResNet-50 list (quick checks)")
    parser.add_argument("-n", "--ranks", type=int, default=2,
                        help="ranks on one host (default 2; with --cluster: nodes x ranks)")
    parser.add_argument("--cluster", metavar="KxR",
                        help="run on a cluster of K network namespaces with R ranks each "
                             "(root; keras_ddl.cluster)")
    parser.add_argument("--rate", default="1gbit", help="with --cluster: link rate each way")
    parser.add_argument("--burst", default=None,
                        help="with --cluster: bytes each link's token bucket holds")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds a launch may take before it is stopped and the bench "
                             "fails (default 1800)")
    parser.add_argument("--json", help="also write the results to this JSON file")


def check_arguments(parser, args):
    """Errors that need no launch, each naming its argument."""
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, not {args.reps}")
    if args.chain < 1:
        parser.error(f"--chain must be >= 1, not {args.chain}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0, not {args.timeout}")
    if args.ranks < 2:
        parser.error(f"--ranks must be >= 2, not {args.ranks}")
    if args.gradient_tensors is not None and args.gradient_tensors < 1:
        parser.error(f"--gradient-tensors must be >= 1, not {args.gradient_tensors}")
    try:
        parse_sizes(args.sizes)
    except ValueError as e:
        parser.error(str(e))
    if args.cluster:
        try:
            cluster_shape(args.cluster)
        except ValueError as e:
            parser.error(str(e))
    if args.horovod_python and not os.access(args.horovod_python, os.X_OK):
        parser.error(f"--horovod-python {args.horovod_python}: no such executable")


def parse_sizes(text):
    """'4096,65536' -> [4096, 65536]; whole float32 tensors of at least 4 bytes."""
    if not text:
        return list(DEFAULT_SIZES)
    sizes = []
    for word in text.split(","):
        try:
            value = int(word)
        except ValueError:
            raise ValueError(f"--sizes: '{word}' is not a byte count") from None
        if value < 4 or value % 4:
            raise ValueError(f"--sizes: {value} is not a positive multiple of 4 bytes "
                             "(float32 elements)")
        sizes.append(value)
    return sizes


def cluster_shape(text):
    """'2x2' -> (2 nodes, 2 ranks each); no racks here."""
    parts = text.lower().split("x")
    try:
        nodes, per_node = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--cluster {text!r}: expected NODESxRANKS, e.g. 2x2") from None
    if nodes < 2 or per_node < 1:
        raise ValueError(f"--cluster {text!r}: at least 2 nodes and 1 rank per node")
    return nodes, per_node


def human_bytes(n):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n}B"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def side_by_side(rows_by_door):
    """One row per case: each peer's time and its ratio to MPICH in its own
    launch, and keras_ddl over Horovod (Horovod's time / keras_ddl's time;
    above 1, keras_ddl is faster). A peer not run leaves its cells "-"."""
    doors = {door: {r["method"]: r for r in rows} for door, rows in rows_by_door.items()}
    ours = doors.get("keras_ddl", {})
    theirs = doors.get("horovod", {})
    table = []
    for method in list(ours) + [m for m in theirs if m not in ours]:
        a, b = ours.get(method), theirs.get(method)
        row = {"method": method, "size": (a or b)["size"],
               "mpi_us": (a or b)["mpi_us"],
               "horovod_us": b["time_us"] if b else "-",
               "keras_ddl_us": a["time_us"] if a else "-",
               "horovod/mpi": b["vs_mpi"] if b else "-",
               "keras_ddl/mpi": a["vs_mpi"] if a else "-",
               "keras_ddl_speedup": b["time_us"] / a["time_us"] if a and b else "-",
               "wrong": sum(r["wrong"] for r in (a, b) if r)}
        if b:
            row["horovod_mpi_us"] = b["mpi_us"]
        table.append(row)
    return table


def format_table(title, columns, rows):
    """nccl-tests style: a '#' title, right-aligned columns."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
        return str(v)
    widths = {c: max([len(c)] + [len(cell(r.get(c, "-"))) for r in rows]) for c in columns}
    lines = [f"# {title}", "  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  ".join(cell(r.get(c, "-")).rjust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _venv_env(python, extra):
    """The environment of a launch under ``python``: its venv's bin first on
    PATH, so mpiexec's helpers and anything the ranks start are that venv's."""
    bindir = os.path.dirname(os.path.abspath(python))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = os.path.dirname(bindir)
    return env


def mpiexec_of(python):
    """The mpiexec beside ``python`` (each venv's own MPICH wheel), else PATH's."""
    beside = os.path.join(os.path.dirname(os.path.abspath(python)), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    from shutil import which
    found = which("mpiexec")
    if found is None:
        raise SystemExit(f"no mpiexec beside {python} nor on PATH")
    return found


def worker_argv(python, door, args, shapes, out):
    argv = [python, os.path.abspath(__file__), "--worker", door, "--shapes", shapes,
            "--out", out, "--reps", str(args.reps), "--chain", str(args.chain),
            "--sizes", ",".join(map(str, parse_sizes(args.sizes)))]
    return argv


def _write_shapes(path, limit):
    """Keras 3's ResNet-50 trainable weight shapes, written by keras_ddl's
    Python in a process of its own (the orchestrator stays free of
    TensorFlow, and Horovod's environment needs no Keras 3)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--write-shapes", path],
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"writing the ResNet-50 shapes failed:\n{proc.stderr[-3000:]}")
    with open(path) as f:
        shapes = json.load(f)
    if limit:
        with open(path, "w") as f:
            json.dump(shapes[:limit], f)


def _run_bounded(argv, env, timeout, what):
    """Runs argv in a process group of its own; past ``timeout`` seconds the
    whole group (mpiexec, its proxies and the ranks) is stopped, TERM first
    so mpiexec can tell its ranks, and the bench fails saying so."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        # communicate() returns once the group's pipes close; a member that closed
        # them and outlived TERM must not outlive the bench
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise SystemExit(f"{what} took more than --timeout {timeout:g} s and was stopped; "
                         f"its last output:\n{(err or '')[-3000:]}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _launch(door, python, args, shapes, tmp, cluster, per_node, ranks):
    out = os.path.join(tmp, f"{door}.json")
    place = (cluster.mpiexec_args(per_node) if cluster is not None else [])
    from keras_ddl_tools.cluster.netns import MPI_ENV
    argv = [mpiexec_of(python), *place, "-n", str(ranks),
            *worker_argv(python, door, args, shapes, out)]
    before = loadavg()
    print(f"# {door}: {' '.join(argv)}  (loadavg {before})", flush=True)
    proc = _run_bounded(argv, _venv_env(python, MPI_ENV if cluster else {}), args.timeout,
                        f"the {door} launch")
    if proc.returncode != 0:
        raise SystemExit(f"the {door} launch failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(out) as f:
        payload = json.load(f)
    payload["loadavg"] = [before, loadavg()]
    return payload


def run(args):
    """Both launches (keras_ddl's first), the tables, and the JSON file."""
    if args.cluster:
        nodes, per_node = cluster_shape(args.cluster)
        ranks = nodes * per_node
        from keras_ddl_tools.cluster.netns import NetnsCluster, missing_requirements
        why = missing_requirements()
        if why:
            raise SystemExit(f"--cluster {args.cluster}: {why}")
        cluster = NetnsCluster(nodes, args.rate, burst=args.burst)
        where = (f"{nodes} network-namespace nodes x {per_node} rank(s), links {args.rate} "
                 "each way")
    else:
        nodes, per_node, ranks, cluster = 1, args.ranks, args.ranks, None
        where = f"one host, {ranks} ranks"
    doors = [("keras_ddl", sys.executable)]
    skipped = None
    if args.horovod_python:
        doors.append(("horovod", args.horovod_python))
    else:
        skipped = NO_HOROVOD
        print(f"# {skipped}", flush=True)
    payloads = {}
    with tempfile.TemporaryDirectory(prefix="ddl_peers_") as tmp:
        shapes = os.path.join(tmp, "resnet50_shapes.json")
        _write_shapes(shapes, args.gradient_tensors)
        if cluster is not None:
            cluster.up()
        try:
            for door, python in doors:
                payloads[door] = _launch(door, python, args, shapes, tmp, cluster, per_node,
                                         ranks)
        finally:
            if cluster is not None:
                cluster.down()
    for door, payload in payloads.items():
        v = payload["versions"]
        print(format_table(
            f"{door} ({FRONT_DOORS[door]}): {where}; " +
            ", ".join(f"{k} {v[k]}" for k in sorted(v)) +
            f"; median of {args.reps} interleaved repetitions; mpi = MPI_Allreduce through "
            f"mpi4py in the same launch; loadavg {' -> '.join(payload['loadavg'])}",
            COLUMNS, payload["rows"]), flush=True)
    table = side_by_side({d: p["rows"] for d, p in payloads.items()})
    print(format_table(
        "side by side: X/mpi = MPICH time / X time in X's launch; keras_ddl_speedup = "
        "Horovod time / keras_ddl time (launches one after the other)"
        + (f"; {skipped}" if skipped else ""), SIDE_COLUMNS, table), flush=True)
    if args.json:
        from keras_ddl_tools.results import write_json
        write_json(args.json, {
            "ranks": ranks, "nodes": nodes, "ranks_per_node": per_node, "where": where,
            "rate": args.rate if cluster else None,
            "horovod_skipped": skipped,
            "peers": {d: {"versions": p["versions"], "loadavg": p["loadavg"]}
                      for d, p in payloads.items()},
            **{d: p["rows"] for d, p in payloads.items()},
            "side_by_side": table})


# --- the ranks (either environment, under mpiexec) ----------------------------------------

class Rank:
    """What every case of one launch shares: the front door, the world and
    the timer."""

    def __init__(self, door, reps):
        import numpy as np
        import tensorflow as tf
        from mpi4py import MPI
        import importlib
        self.np, self.tf, self.MPI = np, tf, MPI
        self.comm = MPI.COMM_WORLD
        self.hvd = importlib.import_module(FRONT_DOORS[door])
        self.hvd.init()
        self.n, self.rank = self.hvd.size(), self.hvd.rank()
        if (self.n, self.rank) != (self.comm.Get_size(), self.comm.Get_rank()):
            raise RuntimeError(f"{door}: rank {self.rank} of {self.n}, but MPI says "
                               f"{self.comm.Get_rank()} of {self.comm.Get_size()}")
        self.door, self.reps = door, reps

    def timed(self, fn, calls=1):
        """The slowest rank's seconds for ``calls`` calls of fn, the ranks
        starting together: a collective is done when every rank is."""
        self.comm.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return self.comm.allreduce(time.perf_counter() - start, op=self.MPI.MAX)

    def inputs(self, shape):
        """This rank's float32 input: element i is i % 7 + rank."""
        tf = self.tf
        count = 1
        for d in shape:
            count *= d
        flat = tf.cast(tf.range(count) % 7 + self.rank, tf.float32)
        return tf.reshape(flat, shape)

    def wrong(self, result, average):
        """Elements of result (the exact sum, or average, of every rank's
        ``inputs``) that differ, summed over the ranks."""
        tf = self.tf
        count = int(tf.size(result))
        offset = self.n * (self.n - 1) / 2
        flat = tf.cast(tf.range(count) % 7, tf.float32)
        expected = flat + offset / self.n if average else flat * self.n + offset
        bad = int(tf.math.count_nonzero(tf.reshape(result, [-1]) != expected))
        return self.comm.allreduce(bad, op=self.MPI.SUM)

    def row(self, method, nbytes, count, redop, times, calls, base, wrong):
        """A row from the per-sample seconds of ours and the baseline."""
        t = statistics.median(times) / calls
        tb = statistics.median(base) / calls
        algbw = nbytes / t / 1e9
        return {"method": method, "size": nbytes, "count": count, "type": "float32",
                "redop": redop, "time_us": t * 1e6, "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (self.n - 1) / self.n, "mpi_us": tb * 1e6,
                "vs_mpi": tb / t, "wrong": wrong,
                "time_us_runs": [v / calls * 1e6 for v in times],
                "mpi_us_runs": [v / calls * 1e6 for v in base]}


def eager_rows(r, sizes):
    rows = []
    for nbytes in sizes:
        count = nbytes // 4
        x = r.inputs([count])
        send = r.np.array(x)  # a copy: a tensor's .numpy() may share its buffer
        recv = r.np.empty_like(send)
        # Small calls are timed in runs, so a sample is not one timer tick.
        calls = max(1, min(20, (1 << 20) // nbytes))
        name = f"peers.eager.{nbytes}"
        held = {}

        def ours():
            held["out"] = r.hvd.allreduce(x, op=r.hvd.Sum, name=name)

        def mpi():
            r.comm.Allreduce(send, recv, op=r.MPI.SUM)
        ours()
        mpi()
        times, base = [], []
        for _ in range(r.reps):  # interleaved: both see the same machine
            times.append(r.timed(ours, calls))
            base.append(r.timed(mpi, calls))
        rows.append(r.row(f"eager {human_bytes(nbytes)}", nbytes, count, "sum", times, calls,
                          base, r.wrong(held.pop("out"), average=False)))
    return rows


def chain_row(r, links):
    tf, hvd = r.tf, r.hvd
    count = CHAIN_BYTES // 4
    x = r.inputs([count])

    @tf.function
    def chain(t):
        # Each call waits for the previous one: a chain of small collectives,
        # as a model's per-layer statistics make.
        for i in range(links):
            t = hvd.allreduce(t, op=hvd.Average, name=f"peers.chain.{i}")
        return t
    send = r.np.array(x)
    work, recv = r.np.empty_like(send), r.np.empty_like(send)

    def mpi():
        # From the same input every time (a 4 KB copy): the sums double
        # each call and would pass float32's range over the repetitions.
        work[...] = send
        a, b = work, recv
        for _ in range(links):
            r.comm.Allreduce(a, b, op=r.MPI.SUM)
            a, b = b, a
    held = {"out": chain(x)}
    mpi()
    times, base = [], []
    for _ in range(r.reps):
        times.append(r.timed(lambda: held.update(out=chain(x))))
        base.append(r.timed(mpi))
    return r.row(f"chain of {links} x {human_bytes(CHAIN_BYTES)}, tf.function (per call)",
                 CHAIN_BYTES, count, "avg", [t / links for t in times], 1,
                 [t / links for t in base], r.wrong(held["out"], average=True))


def gradient_rows(r, shapes):
    tf, hvd, np = r.tf, r.hvd, r.np
    tensors = [r.inputs(list(s)) for s in shapes]
    arrays = [r.np.array(t) for t in tensors]
    recvs = [np.empty_like(a) for a in arrays]
    nbytes = sum(a.nbytes for a in arrays)
    count = nbytes // 4

    # The graph holds the gradients (captured, as a training step's are).
    @tf.function
    def per_tensor():
        return [hvd.allreduce(t, op=hvd.Sum, name=f"peers.grad.{i}")
                for i, t in enumerate(tensors)]

    @tf.function
    def grouped():
        return hvd.grouped_allreduce(tensors, op=hvd.Sum, name="peers.grads")

    def mpi():
        for a, b in zip(arrays, recvs):
            r.comm.Allreduce(a, b, op=r.MPI.SUM)
    held = {"per_tensor": per_tensor(), "grouped": grouped()}
    mpi()
    times = {"per_tensor": [], "grouped": []}
    base = []
    for _ in range(r.reps):
        times["per_tensor"].append(r.timed(lambda: held.update(per_tensor=per_tensor())))
        times["grouped"].append(r.timed(lambda: held.update(grouped=grouped())))
        base.append(r.timed(mpi))
    label = f"ResNet-50's {len(shapes)} gradients, tf.function"
    rows = []
    for key, what in (("per_tensor", "an allreduce per tensor"),
                      ("grouped", "one grouped_allreduce")):
        wrong = sum(r.wrong(out, average=False) for out in held[key])
        rows.append(r.row(f"{label}, {what}", nbytes, count, "sum", times[key], 1, base,
                          wrong))
    return rows


def versions(r):
    import mpi4py
    lib = " ".join(r.MPI.Get_library_version().splitlines()[0].split())
    out = {"tensorflow": r.tf.__version__, "mpi4py": mpi4py.__version__, "mpi": lib}
    if r.door == "horovod":
        import horovod
        out["horovod"] = horovod.__version__
        out["horovod_controller"] = "mpi" if r.hvd.mpi_enabled() else "gloo"
    else:
        import keras_ddl
        out["keras_ddl"] = keras_ddl.__version__
    return out


def worker(args):
    r = Rank(args.worker, args.reps)
    with open(args.shapes) as f:
        shapes = json.load(f)
    rows = eager_rows(r, parse_sizes(args.sizes))
    rows.append(chain_row(r, args.chain))
    rows += gradient_rows(r, shapes)
    if r.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"versions": versions(r), "ranks": r.n, "rows": rows}, f)
    r.comm.Barrier()


def write_shapes(path):
    import keras
    model = keras.applications.ResNet50(weights=None)
    with open(path, "w") as f:
        json.dump([[int(d) for d in w.shape] for w in model.trainable_weights], f)


def _script_main(argv):
    parser = argparse.ArgumentParser(description="the ranks' side of bench peers")
    parser.add_argument("--worker", choices=sorted(FRONT_DOORS))
    parser.add_argument("--write-shapes", metavar="PATH")
    parser.add_argument("--shapes")
    parser.add_argument("--out")
    parser.add_argument("--sizes")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--chain", type=int, default=20)
    args = parser.parse_args(argv)
    if args.write_shapes:
        write_shapes(args.write_shapes)
    else:
        worker(args)


if __name__ == "__main__":
    # Run as a script, this directory comes first on sys.path, and its
    # files (cluster.py, common.py ...) would shadow modules of the same
    # name that TensorFlow or Horovod import.
    sys.path.pop(0)
    _script_main(sys.argv[1:])
