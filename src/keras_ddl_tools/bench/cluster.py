"""Allreduce across a network: the benchmark builds a cluster of network
namespaces (keras_ddl.cluster: K nodes, links capped at a rate), launches
``python -m keras_ddl.bench allreduce`` on it once per algorithm
(DDL_ALLREDUCE=auto / hierarchical / flat), and prints one table: per size,
each algorithm's time, fp16 compression (with the automatic choice), MPICH's
``MPI_Allreduce`` over the same links (measured interleaved in every launch;
each ratio uses its own launch's baseline), and the link bound.

The link bound is what the links allow: each node must send (and receive)
2(K-1)/K of the buffer, so no allreduce of S bytes over K nodes finishes
before 2(K-1)/K x S / rate. With R racks behind uplinks of rate U, each
rack must also send 2(R-1)/R of it through its uplink: the bound is
max(2(K-1)/K x S / rate, 2(R-1)/R x S / U).

Run as root, without mpiexec (the benchmark launches it):

    python -m keras_ddl.bench allreduce --cluster 2x2 --rate 1gbit --reps 5
    python -m keras_ddl.bench allreduce --cluster 2x4x1 --rate 1gbit --uplink 250mbit
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

from ..cluster import MPI_ENV, NetnsCluster, find_mpiexec, parse_rate
from .fit import _print_rows

ALGORITHMS = ("auto", "hierarchical", "flat", "racks", "racks-fp16up", "probe", "none",
              "unknown")
# What each name sets in the ranks' environment (otherwise DDL_ALLREDUCE=name).
# probe: auto with the racks measured at init (DDL_TOPOLOGY=probe; with
# --no-topology auto probes by default from 3 nodes on); none: auto told
# one switch (DDL_TOPOLOGY=none: the pairwise schedule for large calls);
# unknown: auto told nothing and not probing (DDL_TOPOLOGY=unknown: the
# chain for large calls across 3 or more nodes).
ALGORITHM_ENV = {"racks-fp16up": {"DDL_ALLREDUCE": "racks", "DDL_UPLINK_COMPRESSION": "fp16"},
                 "probe": {"DDL_ALLREDUCE": "auto", "DDL_TOPOLOGY": "probe"},
                 "none": {"DDL_ALLREDUCE": "auto", "DDL_TOPOLOGY": "none"},
                 "unknown": {"DDL_ALLREDUCE": "auto", "DDL_TOPOLOGY": "unknown"}}
DEFAULT_ALGORITHMS = ("auto", "hierarchical", "flat")


def parse_shape(text):
    """'KxL' -> (K, L, 1); 'RxNxL' (racks of N nodes) -> (R*N, L, R)."""
    try:
        parts = [int(v) for v in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 2:
        parts = [1] + parts
    if len(parts) != 3:
        raise SystemExit(f"--cluster {text!r}: expected NODESxRANKS, e.g. 2x2, or "
                         "RACKSxNODESxRANKS, e.g. 2x4x1") from None
    racks, per_rack, per_node = parts
    if racks < 1 or per_node < 1 or racks * per_rack < 2 or per_rack < 1:
        raise SystemExit(f"--cluster {text!r}: at least 2 nodes and 1 rank per node")
    return racks * per_rack, per_node, racks


def link_bound_s(nbytes, nodes, rate_bps, racks=1, uplink_bps=None):
    node = 2 * (nodes - 1) / nodes * nbytes / (rate_bps / 8)
    if racks < 2:
        return node
    return max(node, 2 * (racks - 1) / racks * nbytes / (uplink_bps / 8))


def default_algorithms(racks, per_node, told=True):
    """Without racks, every path; with racks, auto (which takes them when
    told), the rack allreduce by name (when told) and the two-level path
    over the same links (the one-switch schedules, what auto ran without a
    topology before the chain)."""
    if racks < 2:
        return DEFAULT_ALGORITHMS
    two_level = "flat" if per_node == 1 else "hierarchical"
    return ("auto", "racks", two_level) if told else ("auto", two_level)


def _launch(cluster, per_node, algorithm, args, sizes, fp16, json_path, gradients=False):
    """One mpiexec launch of the single-host benchmark on the cluster; its
    JSON payload (``allreduce`` rows, and ``resnet50_gradients`` when
    ``gradients``)."""
    argv = [find_mpiexec(), *cluster.mpiexec_args(per_node), "-n", str(cluster.nodes * per_node),
            sys.executable, "-m", "keras_ddl.bench", "allreduce", "--sizes",
            ",".join(map(str, sizes)), "--reps", str(args.reps), "--json", json_path]
    if not gradients:
        argv.append("--skip-resnet")
    elif getattr(args, "gradient_tensors", None):
        argv += ["--gradient-tensors", str(args.gradient_tensors)]
    if fp16:
        argv.append("--with-fp16")
    env = dict(os.environ, **MPI_ENV, TF_CPP_MIN_LOG_LEVEL="2",
               **ALGORITHM_ENV.get(algorithm, {"DDL_ALLREDUCE": algorithm}))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {algorithm} launch failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(json_path) as f:
        return json.load(f)


def _verdict_text(launch):
    """A launch's probe verdict with what its later passes showed: racks
    "(confirmed)", unclear "(racks unconfirmed)" when a second pass
    disagreed, "(slow pairs measured again)" when they were."""
    verdict = str(launch.get("probe_verdict") or "-")
    checks = launch.get("probe_checks") or ""
    if launch.get("probe_confirmed"):
        return verdict + " (confirmed)"
    if "unconfirmed" in checks:
        return verdict + " (racks unconfirmed)"
    if "measured again" in checks:
        return verdict + " (slow pairs measured again)"
    return verdict


def run(args, sizes, human_bytes):
    nodes, per_node, racks = parse_shape(args.cluster)
    rate_bps = parse_rate(args.rate)
    uplink = getattr(args, "uplink", None) or args.rate
    uplink_bps = parse_rate(uplink)
    told = not getattr(args, "no_topology", False)
    algorithms = [a for a in (args.algorithms or
                              ",".join(default_algorithms(racks, per_node, told))).split(",") if a]
    for a in algorithms:
        if a not in ALGORITHMS:
            raise SystemExit(f"--algorithms: '{a}' is not one of {', '.join(ALGORITHMS)}")
    runs, gradient_runs, networks, probe_seconds, launches = {}, [], {}, {}, {}
    cluster = NetnsCluster(nodes // racks, args.rate, burst=args.burst, racks=racks,
                           uplink=uplink, tell_topology=told)
    with cluster, tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for a in algorithms:
                first = a == algorithms[0]
                payload = _launch(cluster, per_node, a, args, sizes,
                                  fp16=first and not getattr(args, "no_fp16", False),
                                  json_path=os.path.join(tmp, f"{a}.{rnd}.json"),
                                  gradients=first and getattr(args, "with_resnet", False))
                runs.setdefault(a, []).append(payload["allreduce"])
                if "network" in payload:
                    networks.setdefault(a, payload["network"])
                    probe_seconds.setdefault(a, []).append(
                        payload["network"].get("probe_seconds", 0.0))
                    launches.setdefault(a, []).append(
                        {k: payload["network"].get(k) for k in
                         ("schedule", "probe_verdict", "probe_seconds", "probe_confirmed",
                          "probe_checks")})
                if "resnet50_gradients" in payload:
                    gradient_runs.append(payload["resnet50_gradients"])
    table = []
    for i, nbytes in enumerate(sizes):
        bound = link_bound_s(nbytes, nodes, rate_bps, racks, uplink_bps)
        row = {"size": human_bytes(nbytes), "bound_us": bound * 1e6}
        wrong = 0
        first = algorithms[0]
        for a in algorithms:
            times = [r[i]["time_us"] for r in runs[a]]
            base = [r[i]["baseline_us"] for r in runs[a]]
            row[f"{a}_us"] = statistics.median(times)
            row[f"{a}/mpi"] = statistics.median(b / t for b, t in zip(base, times))
            wrong += sum(r[i]["wrong"] for r in runs[a])
        row["mpi_us"] = statistics.median(r[i]["baseline_us"] for r in runs[first])
        if all("fp16_us" in r[i] for r in runs[first]):
            row["fp16_us"] = statistics.median(r[i]["fp16_us"] for r in runs[first])
            row["fp16_speedup"] = statistics.median(
                r[i]["time_us"] / r[i]["fp16_us"] for r in runs[first])
        row[f"{first}_of_bound"] = bound * 1e6 / row[f"{first}_us"]
        row["mpi_of_bound"] = bound * 1e6 / row["mpi_us"]
        # fp16 on the uplinks rounds: a faster result, not the same one
        others = [row[f"{a}_us"] for a in algorithms if a not in (first, "racks-fp16up")]
        if others:
            row[f"best/{first}"] = min(others) / row[f"{first}_us"]
        two_level = "flat" if per_node == 1 else "hierarchical"
        if racks > 1 and two_level in algorithms and first != two_level:
            row[f"{two_level}/{first}"] = row[f"{two_level}_us"] / row[f"{first}_us"]
        if "racks-fp16up" in algorithms and first != "racks-fp16up":
            row[f"{first}/racks-fp16up"] = row[f"{first}_us"] / row["racks-fp16up_us"]
        row["wrong"] = wrong
        table.append(row)
    columns = ["size", "bound_us", "mpi_us"] + [f"{a}_us" for a in algorithms] + \
              [f"{a}/mpi" for a in algorithms] + [f"{algorithms[0]}_of_bound", "mpi_of_bound"] + \
              ([f"best/{algorithms[0]}"] if len(algorithms) > 1 else []) + \
              [c for c in (f"flat/{algorithms[0]}", f"hierarchical/{algorithms[0]}",
                           f"{algorithms[0]}/racks-fp16up")
               if racks > 1 and c in table[0]] + \
              ["fp16_us", "fp16_speedup", "wrong"]
    shape = (f"{racks} racks x {nodes // racks} nodes" if racks > 1 else f"{nodes} nodes")
    if racks > 1 and not told:
        shape += " (racks not told)"
    title = (f"allreduce across {shape} x {per_node} rank(s), links {args.rate} each way "
             + (f"(uplinks {uplink}, bound max(2(K-1)/K x S/link, 2(R-1)/R x S/uplink)) "
                if racks > 1 else "") +
             f"with a {human_bytes(cluster.burst)} token bucket (network namespaces, MPI over "
             f"TCP), float32 sum; median over {args.rounds} "
             f"launch(es) of the median of {args.reps} interleaved repetitions; X/mpi = MPICH "
             f"time / X time in the same launch; fp16 = {algorithms[0]} with "
             f"Compression.fp16, fp16_speedup = fp32 time / fp16 time")
    _print_rows(title, [{c: row.get(c, "-") for c in columns} for row in table])
    for a, network in networks.items():
        probe = (f" (the probe took {statistics.median(probe_seconds[a]):.2f} s at init, median "
                 "of the launches; verdicts: "
                 + ", ".join(_verdict_text(x) for x in launches[a]) + ")"
                 if network.get("probe_seconds") else "")
        print(f"# {a}: large calls across nodes ran '{network['schedule']}'{probe}: "
              f"{network['description']}")
    gradients = _gradient_table(gradient_runs, algorithms[0])
    if gradients:
        _print_rows(f"the Keras 3 ResNet-50 gradient list ({gradients[0]['tensors']}), float32 "
                    f"sum, DDL_ALLREDUCE={algorithms[0]}; median over {len(gradient_runs)} "
                    "launch(es); vs_mpi = mpi4py per-tensor time / this time in the same launch",
                    [{c: row[c] for c in ("method", "time_us", "vs_mpi", "wrong")}
                     for row in gradients])
    if args.json:
        from keras_ddl_tools.results import write_json
        write_json(args.json, {"nodes": nodes, "ranks_per_node": per_node, "rate": args.rate,
                               "racks": racks, "uplink": uplink, "topology_told": told,
                               # What each algorithm's launches ran across nodes (the
                               # first launch's; the probe's seconds of every launch).
                               "schedules": [{"method": a, "schedule": n["schedule"],
                                              "probe_seconds": statistics.median(
                                                  probe_seconds[a]),
                                              "probe_verdict": ", ".join(
                                                  _verdict_text(x) for x in launches[a])}
                                             for a, n in networks.items()],
                               "burst_bytes": cluster.burst, "rows": table, "raw": runs,
                               **({"gradients": gradients} if gradients else {})})
    if args.plot and "fp16_us" in table[0]:
        _plot(args.plot, table, sizes, algorithms, nodes, per_node, args.rate, human_bytes)


def _gradient_table(gradient_runs, algorithm):
    """The gradient-list rows of each launch, as medians over the launches;
    every ratio is taken within its own launch first."""
    if not gradient_runs:
        return []
    table = []
    for i, row in enumerate(gradient_runs[0]):
        launches = [run[i] for run in gradient_runs]
        wrong = [r["wrong"] for r in launches if r["wrong"] != "-"]
        table.append({"method": row["method"], "tensors": row["tensors"],
                      "algorithm": algorithm,
                      "time_us": statistics.median(r["time_us"] for r in launches),
                      "vs_mpi": statistics.median(r["vs_separate"] for r in launches),
                      "wrong": sum(wrong) if wrong else "-"})
    return table


def _plot(path, table, sizes, algorithms, nodes, per_node, rate, human_bytes):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed: no plot written")
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for a in algorithms:
        ax.plot(sizes, [r["bound_us"] / r[f"{a}_us"] for r in table], marker="o",
                label=f"keras_ddl {a}")
    ax.plot(sizes, [r["bound_us"] / r["fp16_us"] for r in table], marker="^",
            label=f"keras_ddl {algorithms[0]} + fp16")
    ax.plot(sizes, [r["bound_us"] / r["mpi_us"] for r in table], marker="s", label="MPICH")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [human_bytes(b) for b in sizes], rotation=45)
    ax.set_xlabel("message size (float32)")
    ax.set_ylabel("link bound / time (1 = the links' limit)")
    ax.set_title(f"allreduce, {nodes} nodes x {per_node}, {rate} links")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"# plot written to {path}")
