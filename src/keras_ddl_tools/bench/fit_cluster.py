"""Weak scaling across a network: ``model.fit`` with DDLStrategy on 2 nodes
x 1 rank of a namespace cluster (keras_ddl.cluster, links capped at
``--rate``) against the same program on 1 rank, same per-rank batch, one
core and one TensorFlow thread per rank (each rank pins itself to the core
of its rank number). Four layouts: gradient overlap off / on, float32 /
fp16 on the wire, so the table shows what hides behind the backward pass.

    python -m keras_ddl.bench fit --cluster 2 --rate 1gbit --model resnet50 \\
        --image-size 128 --batch 8 --steps 6 --reps 2

``efficiency`` = 1-rank step time / 2-rank step time (medians over the
fits' steps, first step of each fit left out, then over launches), the
product of ``machine`` = 1 rank / 2 independent plain-Keras ranks (one per
node, no collectives: what the ranks cost each other through the machine)
and ``communication`` = 2 independent / 2 ranks. A
second table reads rank 0's DDL_TIMELINE trace of the first round of each
layout (keras_ddl.bench.timeline_overlap): how much allreduce time fell
inside the window in which tensors were handed over and how much the step
waited for after the last gradient.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from ..cluster import MPI_ENV, NetnsCluster, find_mpiexec
from . import timeline_overlap
from .fit import _print_rows

LAYOUTS = [("off", "none"), ("on", "none"), ("off", "fp16"), ("on", "fp16")]


def _launch(cluster, nodes, args, env_extra, path, independent=False):
    argv = [find_mpiexec(), *cluster.mpiexec_args(1), "-n", str(nodes), sys.executable, "-m",
            "keras_ddl.bench", "fit", "--batch", str(args.batch), "--steps", str(args.steps),
            "--reps", str(args.reps), "--threads", str(args.threads), "--json", path,
            "--model", args.model, "--independent" if independent else "--ddl-only"]
    if args.image_size:
        argv += ["--image-size", str(args.image_size)]
    env = dict(os.environ, **MPI_ENV, **env_extra, DDL_BENCH_PIN_RANK="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-3000:]}")
    with open(path) as f:
        return json.load(f)


def run(args):
    nodes = args.cluster
    if nodes < 2:
        raise SystemExit("--cluster takes the number of nodes (>= 2), one rank each")
    steps = {"1": [], "independent": []}
    identical, traces = {}, {}
    with NetnsCluster(nodes, args.rate) as cluster, tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            path = os.path.join(tmp, f"one.{rnd}.json")
            # The 1-rank run is the same DDLStrategy program on node1 alone.
            steps["1"] += _launch(cluster, 1, args, {"DDL_BENCH_FIT_OVERLAP": "on"},
                                  path)["step_s"]["ddl"]
            # The control: every node trains plain Keras on its own at once
            # (no collectives), so the machine's share of the slowdown (two
            # busy cores, shared caches and memory) is told apart from what
            # the communication costs.
            path = os.path.join(tmp, f"independent.{rnd}.json")
            steps["independent"] += _launch(cluster, nodes, args, {}, path,
                                            independent=True)["step_s"]["plain"]
            for overlap, compression in LAYOUTS:
                key = f"{overlap}/{compression}"
                path = os.path.join(tmp, f"{overlap}.{compression}.{rnd}.json")
                env = {"DDL_BENCH_FIT_OVERLAP": overlap, "DDL_BENCH_FIT_COMPRESSION": compression}
                if rnd == 0:  # rank 0 traces the first round of every layout
                    env["DDL_TIMELINE"] = traces[key] = os.path.join(tmp, f"{key.replace('/', '.')}.trace")
                result = _launch(cluster, nodes, args, env, path)
                steps.setdefault(key, []).extend(result["step_s"]["ddl"])
                identical[key] = identical.get(key, True) and bool(result["identical"])
        spans = []
        for overlap, compression in LAYOUTS:
            key = f"{overlap}/{compression}"
            try:
                row = timeline_overlap.summary(traces[key])
            except (OSError, ValueError, IndexError) as e:  # the step times still count
                print(f"# no timeline summary for {key}: {e!r}", flush=True)
                continue
            if args.json:  # kept beside the results, for chrome://tracing or Perfetto
                shutil.copy(traces[key], f"{os.path.splitext(args.json)[0]}.{overlap}."
                                         f"{compression}.trace.json")
            spans.append({"overlap": overlap,
                          "wire": "fp32" if compression == "none" else compression,
                          **{k: row[k] for k in ("steps", "collectives", "window_ms",
                                                 "busy_ms", "hidden_ms", "exposed_ms",
                                                 "hidden_fraction")}})
    one = statistics.median(s[0] for s in steps["1"])
    alone = statistics.median(s[0] for s in steps["independent"])
    rows = []
    for overlap, compression in LAYOUTS:
        key = f"{overlap}/{compression}"
        many = statistics.median(s[0] for s in steps[key])
        rows.append({"overlap": overlap, "wire": "fp32" if compression == "none" else compression,
                     "1rank_ms": one * 1e3, f"{nodes}x1_ms": many * 1e3,
                     "efficiency": one / many, f"{nodes}x1_indep_ms": alone * 1e3,
                     "machine": one / alone, "communication": alone / many,
                     "identical": "yes" if identical[key] else "NO"})
    title = (f"weak scaling across {nodes} nodes x 1 rank, links {args.rate} each way "
             f"(network namespaces, MPI over TCP): DDLStrategy, {args.model}"
             f"{' ' + str(args.image_size) + ' px' if args.image_size else ''}, batch "
             f"{args.batch} per rank, {args.threads} TF thread(s), one core per rank; "
             f"{args.rounds} round(s) x {args.reps} fit(s) x {args.steps} steps")
    _print_rows(title, rows)
    if spans:
        _print_rows(f"where the allreduces ran: rank 0's DDL_TIMELINE, round 1, medians over its "
                    f"steps (window = first to last tensor handed over; hidden = allreduce "
                    f"time inside it; exposed = last gradient to last allreduce end)",
                    spans)
    if args.json:
        from keras_ddl_tools.results import write_json
        write_json(args.json, {"rows": rows, "step_s": steps, "timeline": spans})
