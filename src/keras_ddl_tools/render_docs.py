"""Fills the figure tables of README.md and docs/*.md (DOCS) from docs/results/*.json.

    python -m keras_ddl_tools.render_docs           # rewrite the marked blocks
    python -m keras_ddl_tools.render_docs --check   # exit 1 if a block is stale

A block is two HTML comments around generated text::

    <!-- results:VIEW -->
    ... generated, do not edit ...
    <!-- /results:VIEW -->

VIEW names an entry of VIEWS below: which results file, which table, which
rows and columns. Every table is followed by where its figures come from:
the command, the dates, the commit, the machine and the conditions.
Standard library only.
"""

import argparse
import os
import re
import statistics
import sys

from . import results as R
from .rates import parse_rate

DOCS = ("README.md", "docs/PERFORMANCE.md", "docs/topology.md", "docs/untold_network.md",
        "docs/failures.md", "docs/internals/scale_harness.md")
BLOCK = re.compile(r"(<!-- results:(?P<view>[\w.\-]+) -->\n)(?P<body>.*?)"
                   r"(<!-- /results:(?P=view) -->)", re.S)


def _ms(us):
    return f"{us / 1000:.2f}" if us >= 100 else f"{us / 1000:.3f}"


def _ratio(v):
    return f"{v:.2g}x" if v < 0.1 else f"{v:.2f}x"


def _range(field, fmt):
    return f"{fmt(field['median'])} ({fmt(field['min'])}-{fmt(field['max'])})"


def _rows(result, table, keys=None):
    rows = result["tables"].get(table)
    if rows is None:
        raise KeyError(f"results file '{result['name']}' has no table '{table}'")
    by_key = {r["key"]: r for r in rows}
    if keys is None:
        return rows
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise KeyError(f"results file '{result['name']}', table '{table}': no rows {missing}")
    return [by_key[k] for k in keys]


def _source(result):
    """The lines under a table: how to get the same figures again."""
    m = result.get("machine", {})
    first, last = (d.replace("T", " ").rstrip("Z")[:16] for d in result["dates"])
    when = first if first == last else (
        f"{first}-{last[11:]}" if first[:10] == last[:10] else f"{first} to {last}")
    commits = ", ".join(c[:7] + ("-dirty" if c.endswith("-dirty") else "")
                        for c in result["commits"])
    versions = ", ".join(f"{k} {m[k]}" for k in ("tensorflow", "keras", "mpi4py") if k in m)
    machine = f"{m.get('cores', '?')} cores, {m.get('cpu', '?')}, {m.get('kernel', '?')}"
    n = len(result["launches"])
    return (f"Median over {n} launch{'es' if n != 1 else ''} (range: lowest-highest launch), "
            f"from `docs/results/{result['name']}.json`. Command: `{result['command']}`. "
            f"Run {when} UTC, commit {commits}; {machine}"
            f"{'; ' + versions if versions else ''}. Conditions: {result['conditions']}.")


def view_allreduce(result, sizes=None, busbw=False):
    rows = _rows(result, "allreduce", sizes)
    head = ["size", "keras_ddl (ms)", "MPI_Allreduce (ms)", "speed-up over MPI"]
    if busbw:
        head.insert(3, "keras_ddl busbw (GB/s)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["key"], _range(r["time_us"], _ms), _range(r["baseline_us"], _ms)]
        if busbw:
            cells.append(_range(r["busbw_GBps"], lambda v: f"{v:.3g}"))
        cells.append(_range(r["speedup"], _ratio))
        lines.append("| " + " | ".join(cells) + " |")
    ranks = result["launches"][0].get("ranks", "?")
    wrong = sum(max(r["wrong"]["values"]) if isinstance(r["wrong"], dict) else r["wrong"]
                for r in rows if "wrong" in r)
    lines += ["", f"{ranks} ranks on one host, one float32 tensor per call, sum; speed-up = "
                  f"MPI time / keras_ddl time in the same launch; elements differing from the "
                  f"exact result: {wrong}.", "", _source(result)]
    return lines


def view_gradients(result, methods=None, source=True):
    rows = _rows(result, "resnet50_gradients", methods)
    label = rows[0].get("tensors", "")
    head = ["method", "time (ms)", "speed-up over MPI per tensor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['key']} | {_range(r['time_us'], _ms)} | "
                     f"{_range(r['vs_separate'], _ratio)} |")
    lines += ["", f"The Keras 3 ResNet-50 gradient list ({label}), float32 sum."]
    if source:
        lines += ["", _source(result)]
    return lines


def view_readme(result):
    """The README's few rows: some sizes, then the gradient list as one call."""
    sizes = view_allreduce(result, sizes=["4KB", "1MB", "16MB", "64MB"])[:-2]
    grads = view_gradients(result, ["ddl.grouped_allreduce (tf.function)",
                                    "mpi4py Allreduce per tensor"], source=False)
    return sizes + [""] + grads + ["", _source(result)]


def view_fit_overhead(result):
    """DDLStrategy on one process against plain Keras, the same model and data."""
    head = ["model", "plain Keras step (ms)", "DDLStrategy step (ms)",
            "DDLStrategy / plain Keras"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in _rows(result, "fit"):
        lines.append(f"| {r['key']} | {_range(r['plain_ms'], lambda v: f'{v:.1f}')} | "
                     f"{_range(r['ddl_ms'], lambda v: f'{v:.1f}')} | "
                     f"{_range(r['ratio'], lambda v: f'{v:.3f}')} |")
    lines += ["", "Step time of `model.fit` (median over each launch's repetitions); the two "
                  "models are timed interleaved in the same process.", "", _source(result)]
    return lines


def view_cluster_allreduce(result, sizes=None):
    """bench allreduce --cluster KxR: keras_ddl against MPICH and the links' bound."""
    launch = result["launches"][0]
    rows = _rows(result, "rows", sizes)
    first = next(k[:-3] for k in rows[0] if k.endswith("_us") and k not in (
        "bound_us", "mpi_us", "fp16_us"))
    head = ["size", "link bound (ms)", "MPICH (ms)", f"keras_ddl {first} (ms)",
            "speed-up over MPICH", "share of the bound", "fp16 on the wire: speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['key']} | {_ms(r['bound_us']['median'])} | "
                     f"{_range(r['mpi_us'], _ms)} | {_range(r[first + '_us'], _ms)} | "
                     f"{_range(r[first + '/mpi'], _ratio)} | "
                     f"{_range(r[first + '_of_bound'], pct)} | "
                     f"{_range(r['fp16_speedup'], _ratio)} |")
    lines += ["", f"{launch.get('nodes', '?')} nodes x {launch.get('ranks_per_node', '?')} "
                  f"rank(s) per node, network namespaces on one machine, links "
                  f"{launch.get('rate', '?')} each way (token bucket "
                  f"{launch.get('burst_bytes', '?')} bytes); float32 sum. The bound is "
                  "2(K-1)/K x size / link rate for K nodes.", "", _source(result)]
    return lines


def view_racks_allreduce(result, sizes=None):
    """bench allreduce --cluster RxNxL --uplink: the rack-aware allreduce
    (`auto`) against MPICH, the two-level path and the bound of the slowest
    dimension."""
    launch = result["launches"][0]
    rows = _rows(result, "rows", sizes)
    fp16up = all("racks-fp16up_us" in r for r in rows)
    head = ["size", "bound (ms)", "MPICH (ms)", "keras_ddl auto (ms)", "two-level (ms)",
            "auto: share of the bound", "auto over MPICH", "auto over two-level",
            "fp16 on the wire: over auto"]
    if fp16up:
        head += ["fp16 on the uplinks (ms)", "fp16 on the uplinks: over auto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    for r in rows:
        cells = [r["key"], _ms(r["bound_us"]["median"]), _range(r["mpi_us"], _ms),
                 _range(r["auto_us"], _ms), _range(r["flat_us"], _ms),
                 _range(r["auto_of_bound"], pct), _range(r["auto/mpi"], _ratio),
                 _range(r["flat/auto"], _ratio), _range(r["fp16_speedup"], _ratio)]
        if fp16up:
            cells += [_range(r["racks-fp16up_us"], _ms),
                      _range(r["auto/racks-fp16up"], _ratio)]
        lines.append("| " + " | ".join(cells) + " |")
    racks, nodes = launch.get("racks", 1), launch.get("nodes", 0)
    lines += ["", f"{racks} racks x {nodes // max(racks, 1)} nodes x "
                  f"{launch.get('ranks_per_node', '?')} rank(s) per node, network namespaces "
                  f"on one machine: node links {launch.get('rate', '?')} and rack uplinks "
                  f"{launch.get('uplink', '?')} each way; float32 sum. The bound is "
                  "max(2(K-1)/K x size / node link, 2(R-1)/R x size / uplink) for K nodes in "
                  "R racks; two-level is `DDL_ALLREDUCE=flat` (shared memory in a node, one "
                  "flat step across all nodes); fp16 on the wire is auto with "
                  "`Compression.fp16` (every byte sent in float16)"
              + ("; fp16 on the uplinks is the rack allreduce with "
                 "`DDL_UPLINK_COMPRESSION=fp16` (only the across-rack stages in float16)"
                 if fp16up else "")
              + "; X over Y = Y's time / X's time in the same launch.", "", _source(result)]
    return lines


# How the untold views name each method of `bench allreduce --cluster
# ... --no-topology` (its --algorithms). `auto` is the default: since the
# probe runs by default, a results file whose auto ran the chain without
# probing shows what DDL_TOPOLOGY=unknown runs (_untold_label).
UNTOLD_LABELS = {"auto": "default (nothing told)", "flat": "one-switch schedules",
                 "hierarchical": "one-switch schedules", "probe": "auto, DDL_TOPOLOGY=probe",
                 "racks": "racks asked for", "none": "DDL_TOPOLOGY=none (pairwise)",
                 "unknown": "DDL_TOPOLOGY=unknown (chain)"}


def _untold_label(method, schedule_row):
    """A method's column name; `auto` that ran the chain without a probe
    (results files made before the probe ran by default) is the chain as
    DDL_TOPOLOGY=unknown gives it now."""
    probe = schedule_row.get("probe_seconds")
    probed = isinstance(probe, dict) and probe["max"] > 0
    if method == "auto" and schedule_row.get("schedule") == "chain" and not probed:
        return "the chain (no probe)"
    return UNTOLD_LABELS.get(method, method)


def _paired(row, numerator, denominator):
    """Median and range over the launches of numerator / denominator, each
    launch's own pair (the methods alternate within a launch)."""
    pairs = [a / b for a, b in zip(row[numerator]["values"], row[denominator]["values"])]
    return {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)}


def _share_of_bound(row, field):
    """Median and range over the launches of the bound / the field's time."""
    shares = [row["bound_us"]["median"] / t for t in row[field]["values"]]
    return {"median": statistics.median(shares), "min": min(shares), "max": max(shares)}


def view_untold_allreduce(result, sizes=None):
    """bench allreduce --cluster RxNxL (or KxL, one switch) --no-topology:
    a network nobody described; each method asked for (auto, the one-switch
    schedules, DDL_TOPOLOGY=probe, none or unknown) against MPICH in the
    same launch, what each ran across nodes (with the probe's verdicts and
    seconds), the first method's share of the bound, and the first method
    against each other one."""
    launch = result["launches"][0]
    rows = _rows(result, "rows", sizes)
    schedules = _rows(result, "schedules")
    methods = [s["key"] for s in schedules]
    names = {s["key"]: _untold_label(s["key"], s) for s in schedules}
    # The default (auto, when it probed) is the column the others are
    # compared with, wherever it was launched; otherwise the first method.
    first = "auto" if names.get("auto") == UNTOLD_LABELS["auto"] else methods[0]
    label = lambda m: names.get(m, m)  # noqa: E731
    others = [m for m in methods if m != first]
    head = (["size", "bound (ms)", "MPICH (ms)"] + [f"{label(m)} (ms)" for m in methods] +
            [f"{label(first)}: share of the bound"] + [f"{label(m)}: over MPICH" for m in methods]
            + [f"{label(first)}: over {label(m)}" for m in others])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    for r in rows:
        cells = ([r["key"], _ms(r["bound_us"]["median"]), _range(r["mpi_us"], _ms)] +
                 [_range(r[f"{m}_us"], _ms) for m in methods] +
                 [_range(_share_of_bound(r, f"{first}_us"), pct)] +
                 [_range(r[f"{m}/mpi"], _ratio) for m in methods] +
                 [_range(_paired(r, f"{m}_us", f"{first}_us"), _ratio) for m in others])
        lines.append("| " + " | ".join(cells) + " |")

    def ran(s):
        what = s["schedule"] if isinstance(s["schedule"], str) else "/".join(
            sorted(set(s["schedule"]["values"])))
        probe = s.get("probe_seconds")
        if isinstance(probe, dict) and probe["max"] > 0:
            verdicts = s.get("probe_verdict")
            verdicts = (verdicts["values"] if isinstance(verdicts, dict) else
                        [verdicts] * len(probe["values"]) if verdicts else [])
            what += (f", after a start-up probe of {probe['median']:.2f} s "
                     f"({probe['min']:.2f}-{probe['max']:.2f})"
                     + (f" whose verdicts were: {', '.join(verdicts)}" if verdicts else ""))
        return f"{s['key']}: {what}"
    racks, nodes = launch.get("racks", 1), launch.get("nodes", 0)
    told = {"probe": "`probe` sets `DDL_TOPOLOGY=probe`", "none": "`none` sets "
            "`DDL_TOPOLOGY=none` (one switch: the pairwise schedule)", "unknown": "`unknown` "
            "sets `DDL_TOPOLOGY=unknown` (no racks, no probe: the chain)"}
    shape = (f"{racks} racks x {nodes // max(racks, 1)} nodes x "
             f"{launch.get('ranks_per_node', '?')} rank(s) per node, network namespaces on one "
             f"machine: node links {launch.get('rate', '?')} and rack uplinks "
             f"{launch.get('uplink', '?')} each way, hosts listed rack by rack"
             if racks > 1 else
             f"{nodes} nodes x {launch.get('ranks_per_node', '?')} rank(s) per node on one "
             f"switch (one bridge), network namespaces on one machine: node links "
             f"{launch.get('rate', '?')} each way")
    bound = ("max(2(K-1)/K x size / node link, 2(R-1)/R x size / uplink) for K nodes in R racks"
             if racks > 1 else "2(K-1)/K x size / node link for K nodes")
    lines += ["", shape + "; the ranks are told nothing about the network (no `DDL_TOPOLOGY`, "
                  "no `SLURM_TOPOLOGY_ADDR`)"
                  + "".join(f"; {told[m]}" for m in methods if m in told) + "; float32 sum. "
                  "What large calls across nodes ran (`ddl.topology()['schedule']`): "
                  + "; ".join(ran(s) for s in schedules) + f". The bound is {bound}; X over "
                  "MPICH = MPICH's time / X's time in the same launch; X over Y = Y's time / "
                  "X's time, X and Y launched one after the other.", "", _source(result)]
    return lines


def _label_bytes(label):
    """'214 tensors, 97.6 MB' -> bytes; the benchmarks' MB, KB and GB are
    binary (2^20, 2^10, 2^30 bytes), as their size keys are ('64MB')."""
    m = re.search(r"([\d.]+) ?(KB|MB|GB)\b", label)
    return float(m.group(1)) * {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[m.group(2)]


def rack_bound_s(nbytes, nodes, racks, rate, uplink):
    """The slowest dimension's bound, max(2(K-1)/K x S/node link,
    2(R-1)/R x S/uplink), in seconds (the benchmark's bound_us formula)."""
    node = 2 * (nodes - 1) / nodes * nbytes * 8 / parse_rate(rate)
    across = 2 * (racks - 1) / racks * nbytes * 8 / parse_rate(uplink) if racks > 1 else 0
    return max(node, across)


def view_cluster_gradients(result):
    """bench allreduce --cluster ... --with-resnet: the gradient list across
    the cluster, against mpi4py in the same launch, and each method's time
    against the links' bound for the list's bytes."""
    launch = result["launches"][0]
    rows = _rows(result, "gradients")
    racks, nodes = launch.get("racks", 1), launch.get("nodes", 0)
    label = rows[0].get("tensors", "?")
    nbytes = _label_bytes(label)
    bound = rack_bound_s(nbytes, nodes, racks, launch["rate"], launch.get("uplink") or
                         launch["rate"])
    head = ["method", "time (ms)", "speed-up over MPI per tensor", "share of the bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    share = lambda t: f"{bound * 1e6 / t:.2f}"  # noqa: E731
    for r in rows:
        t = r["time_us"]
        lines.append(f"| {r['key']} | {_range(t, _ms)} | {_range(r['vs_mpi'], _ratio)} | "
                     f"{share(t['median'])} ({share(t['max'])}-{share(t['min'])}) |")
    lines += ["", f"The Keras 3 ResNet-50 gradient list ({label}; MB = 2^20 bytes, so "
                  f"{nbytes / 1e6:.1f} x 10^6 bytes), float32 sum, on {racks} racks x "
                  f"{nodes // max(racks, 1)} nodes x {launch.get('ranks_per_node', '?')} "
                  f"rank(s): node links {launch.get('rate', '?')}, uplinks "
                  f"{launch.get('uplink', '?')}; DDL_ALLREDUCE=auto. The bound for the list's "
                  f"bytes over these links is {bound:.2f} s; share of the bound = bound / "
                  "time.", "", _source(result)]
    return lines


def view_fit_scaling(result):
    """bench fit --scaling N: weak scaling on one host, with its control run."""
    rows = _rows(result, "scaling")
    r = rows[0]
    n = int(r["ranks"]["median"]) if isinstance(r["ranks"], dict) else r["ranks"]
    head = ["model", "1 rank step (ms)", f"{n} ranks step (ms)", "efficiency",
            "machine (control)", "communication"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    f3 = lambda v: f"{v:.3f}"  # noqa: E731
    f1 = lambda v: f"{v:.1f}"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['key']} | {_range(r['1rank_ms'], f1)} | "
                     f"{_range(r[f'{n}rank_ms'], f1)} | {_range(r['efficiency'], f3)} | "
                     f"{_range(r['machine'], f3)} | {_range(r['communication'], f3)} |")
    lines += ["", "Weak scaling, each rank pinned to its own core with one TensorFlow thread; "
                  "efficiency = 1-rank step / N-rank step; machine = 1-rank step / step of N "
                  "independent processes without collectives (the control run); communication "
                  "= control step / N-rank step. In each launch efficiency = machine x "
                  "communication; the columns are medians taken separately, so their product "
                  "need not be the median efficiency.",
              "", _source(result)]
    return lines


def view_fit_cluster(result):
    """bench fit --cluster K: weak scaling across network-namespace nodes."""
    rows = _rows(result, "rows")
    head = ["overlap / wire", "efficiency", "machine (control)", "communication"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    f3 = lambda v: f"{v:.3f}"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['key']} | {_range(r['efficiency'], f3)} | "
                     f"{_range(r['machine'], f3)} | {_range(r['communication'], f3)} |")
    lines += ["", "`model.fit` under DDLStrategy, one rank per network-namespace node, one "
                  "core each; efficiency against one rank alone.", "", _source(result)]
    return lines


def view_fit_layout(result):
    """bench fit --overlap both under mpiexec: one allreduce per gradient,
    overlapping backprop, against one grouped allreduce after it, the two
    models interleaved in the same processes."""
    head = ["model", "ranks", "overlap step (ms)", "grouped step (ms)", "overlap / grouped",
            "same weights"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    f1 = lambda v: f"{v:.1f}"  # noqa: E731
    f3 = lambda v: f"{v:.3f}"  # noqa: E731
    for r in _rows(result, "layout"):
        ranks = r["ranks"]["median"] if isinstance(r["ranks"], dict) else r["ranks"]
        same = r["same_bits"] if isinstance(r["same_bits"], str) else "/".join(
            r["same_bits"]["values"])
        lines.append(f"| {r['key']} | {ranks:g} | {_range(r['overlap_ms'], f1)} | "
                     f"{_range(r['grouped_ms'], f1)} | {_range(r['ratio'], f3)} | "
                     f"{'bitwise' if same == 'yes' else same} |")
    lines += ["", "`model.fit` under DDLStrategy, each rank pinned to its own core; step time "
                  "with `overlap_gradients=True` (an allreduce per gradient, started as "
                  "backprop makes it) over `overlap_gradients=False` (one grouped allreduce "
                  "after backprop): below 1, overlapping pays. Same weights: both layouts "
                  "ended every launch with bitwise-identical weights.", "", _source(result)]
    return lines


def view_backup_cost(result):
    """bench backup: what BackupAndRestore(save_freq=N) costs a ResNet-50 step."""
    head = ["written", "state (MB)", "step (s)", "one backup (s)", "training blocked (s)",
            "write (s)", "N = 10", "N = 100", "N = 1000"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = {"sync": "before training goes on", "background": "in the background"}
    for r in _rows(result, "backup_cost", ["sync", "background"]):
        seconds = lambda v: f"{v:.3f}"  # noqa: E731
        share = lambda v: f"{100 * v:.2g}%"  # noqa: E731
        lines.append(
            f"| {names[r['key']]} | {r['state_MB']['median']:.0f} | "
            f"{_range(r['step_s'], seconds)} | {_range(r['save_s'], seconds)} | "
            f"{_range(r['blocked_s'], seconds)} | {_range(r['write_s'], seconds)} | "
            + " | ".join(_range(r[f"per_step@{n}"], share) for n in (10, 100, 1000)) + " |")
    lines += ["", "\"One backup\" is what one backup adds to training (the steps' time with "
              "backups every 10 steps, less without, per backup); the N columns are that cost "
              "as a share of training time at `save_freq = N` (measured at 10, computed from the "
              "same cost for 100 and 1000, valid while a write takes less than N steps).", "",
              _source(result)]
    return lines


def view_scale_table(result):
    """docs/scripts/scale_table.py: the engine at 64-256 thread-ranks, the time per call and
    the silent node's reports."""
    lines = ["| ranks | racks x nodes x local | time per call | silent node: the median rank's "
             "report | the last rank's report |", "| --- | --- | --- | --- | --- |"]
    # A number the same in every launch (the rank count) is merged as a range too.
    ranks = lambda r: int(r["ranks"]["median"])  # noqa: E731
    reported = []
    for r in sorted(_rows(result, "scale"), key=ranks):
        def spread(field, digits, unit):
            f = r[field]
            return (f"{f['median']:.{digits}f} {unit} "
                    f"({f['min']:.{digits}f}-{f['max']:.{digits}f})")
        lines.append(f"| {ranks(r)} | {r['key'].replace('x', ' x ')} | "
                     f"{spread('call_ms', 0, 'ms')} | {spread('verdict_median_s', 2, 's')} | "
                     f"{spread('verdict_slowest_s', 2, 's')} |")
        if r["verdicts"]["min"] != ranks(r):
            reported.append(f"at {ranks(r)} ranks, {r['verdicts']['min']} in the worst launch")
    every = ("every rank reported in every launch" if not reported
             else "not every rank reported: " + "; ".join(reported))
    lines += ["", f"Each launch is one run of `scale_check --table`: its median over the calls "
              f"(time per call), or over the ranks (the reports; {every}).", "",
              _source(result)]
    return lines


def view_peers(result):
    """bench peers: the same script on Horovod and on keras_ddl's Horovod
    front door, each against MPICH in its own launch."""
    rows = _rows(result, "side_by_side")
    head = ["case", "MPICH (ms)", "Horovod (ms)", "Horovod over MPICH", "keras_ddl (ms)",
            "keras_ddl over MPICH", "keras_ddl over Horovod"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(field, fmt):
        return _range(field, fmt) if isinstance(field, dict) else "-"
    for r in rows:
        lines.append(f"| {r['key']} | {cell(r['mpi_us'], _ms)} | {cell(r['horovod_us'], _ms)} "
                     f"| {cell(r['horovod/mpi'], _ratio)} | {cell(r['keras_ddl_us'], _ms)} | "
                     f"{cell(r['keras_ddl/mpi'], _ratio)} | "
                     f"{cell(r['keras_ddl_speedup'], _ratio)} |")
    launch = result["launches"][0]
    peers = launch.get("peers", {})

    def described(door, name):
        v = peers.get(door, {}).get("versions")
        if not v:
            return f"{name}: not run ({launch.get('horovod_skipped') or 'no launch'})"
        extra = f", controller {v['horovod_controller']}" if "horovod_controller" in v else ""
        return (f"{name} {v.get(door, '?')} on TensorFlow {v.get('tensorflow', '?')}{extra}, "
                f"{v.get('mpi', '?')}")
    loads = [float(v.split()[0]) for x in result["launches"]
             for p in x.get("peers", {}).values() for v in p.get("loadavg", [])]
    wrong = sum(max(r["wrong"]["values"]) if isinstance(r["wrong"], dict) else r["wrong"]
                for r in rows)
    lines += ["", f"{launch.get('where', '?')}; float32. {described('horovod', 'Horovod')}; "
                  f"{described('keras_ddl', 'keras_ddl')}. The eager rows are one "
                  "`hvd.allreduce` (op=Sum) per size; the chain's time is per call; the "
                  "ResNet-50 rows are the whole list (MPICH: an `MPI_Allreduce` per tensor). "
                  "The MPICH column is the baseline of keras_ddl's launches (Horovod's "
                  "launches time their own: `horovod_mpi_us` in the results file). "
                  "X over MPICH = MPICH's time / X's time in X's own launch (each launch "
                  "times mpi4py's `Allreduce` interleaved with its calls); keras_ddl over "
                  "Horovod = Horovod's time / keras_ddl's time, their launches one after the "
                  "other. The 1-minute load average during the launches: "
                  + (f"{min(loads):g}-{max(loads):g}" if loads else "?")
                  + f". Elements differing from the exact result: {wrong}.", "",
              _source(result)]
    return lines


# name -> (results file, function, keyword arguments). A new results file
# gets a view here, then a block in README.md or docs/PERFORMANCE.md.
VIEWS = {
    "allreduce_1host.headline": ("allreduce_1host", view_allreduce,
                                 {"sizes": ["4KB", "1MB", "16MB", "64MB"]}),
    "allreduce_1host.readme": ("allreduce_1host", view_readme, {}),
    "allreduce_1host.sizes": ("allreduce_1host", view_allreduce, {"busbw": True}),
    "allreduce_1host.gradients": ("allreduce_1host", view_gradients, {}),
    "fit_1proc.overhead": ("fit_1proc", view_fit_overhead, {}),
    "fit_overlap_2_resnet50.layout": ("fit_overlap_2_resnet50", view_fit_layout, {}),
    "fit_overlap_2_cnn.layout": ("fit_overlap_2_cnn", view_fit_layout, {}),
    "backup_resnet50.cost": ("backup_resnet50", view_backup_cost, {}),
    "scale_harness.table": ("scale_harness", view_scale_table, {}),
    "peers_1host.table": ("peers_1host", view_peers, {}),
    "peers_2x2_1gbit.table": ("peers_2x2_1gbit", view_peers, {}),
    # Views ready for results files not made yet (see docs/results/README.md):
    "cluster_2x1_1gbit.allreduce": ("cluster_2x1_1gbit", view_cluster_allreduce, {}),
    "cluster_2x2_1gbit.allreduce": ("cluster_2x2_1gbit", view_cluster_allreduce, {}),
    "fit_scaling_2.scaling": ("fit_scaling_2", view_fit_scaling, {}),
    "fit_cluster_2x1_1gbit.fit": ("fit_cluster_2x1_1gbit", view_fit_cluster, {}),
    "racks_2x4x1_4to1.allreduce": ("racks_2x4x1_4to1", view_racks_allreduce, {}),
    "racks_2x4x1_1to1.allreduce": ("racks_2x4x1_1to1", view_racks_allreduce, {}),
    "racks_2x4x1_1to1_small.allreduce": ("racks_2x4x1_1to1_small", view_racks_allreduce, {}),
    "racks_2x8x1.allreduce": ("racks_2x8x1", view_racks_allreduce, {}),
    "racks_2x8x1.gradients": ("racks_2x8x1", view_cluster_gradients, {}),
    "racks_2x4x1_4to1_untold.allreduce": ("racks_2x4x1_4to1_untold", view_untold_allreduce, {}),
    "racks_2x8x1_untold.allreduce": ("racks_2x8x1_untold", view_untold_allreduce, {}),
    "racks_2x4x1_4to1_probe.allreduce": ("racks_2x4x1_4to1_probe", view_untold_allreduce, {}),
    "racks_2x4x1_1to1_untold.allreduce": ("racks_2x4x1_1to1_untold", view_untold_allreduce, {}),
    "racks_2x8x1_default.allreduce": ("racks_2x8x1_default", view_untold_allreduce, {}),
    "racks_2x4x1_4to1_default.allreduce": ("racks_2x4x1_4to1_default", view_untold_allreduce,
                                           {}),
    "racks_2x4x1_1to1_default.allreduce": ("racks_2x4x1_1to1_default", view_untold_allreduce,
                                           {}),
    "switch_4x1_default.allreduce": ("switch_4x1_default", view_untold_allreduce, {}),
    "switch_8x1_default.allreduce": ("switch_8x1_default", view_untold_allreduce, {}),
}


def render_view(view, all_results):
    if view not in VIEWS:
        raise KeyError(f"unknown results view '{view}' (known: {', '.join(sorted(VIEWS))})")
    name, fn, kwargs = VIEWS[view]
    if name not in all_results:
        raise KeyError(f"view '{view}' needs docs/results/{name}.json, which does not exist")
    lines = ["<!-- generated by python -m keras_ddl_tools.render_docs; do not edit -->"]
    lines += fn(all_results[name], **kwargs)
    return "\n".join(lines) + "\n"


def render_text(text, all_results):
    """text with every results block re-rendered."""
    def replace(match):
        return match.group(1) + render_view(match.group("view"), all_results) + match.group(4)
    return BLOCK.sub(replace, text)


def blocks(text):
    return [m.group("view") for m in BLOCK.finditer(text)]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m keras_ddl_tools.render_docs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a block differs from the results files")
    args = parser.parse_args(argv)
    all_results = R.load_all()
    stale = []
    for rel in DOCS:
        path = os.path.join(R.REPO, rel)
        with open(path) as f:
            text = f.read()
        new = render_text(text, all_results)
        if new != text:
            stale.append(rel)
            if not args.check:
                with open(path, "w") as f:
                    f.write(new)
    if args.check and stale:
        print(f"stale results blocks in: {', '.join(stale)} "
              f"(run python -m keras_ddl_tools.render_docs)", file=sys.stderr)
        return 1
    print(("rendered: " if stale else "up to date: ") + ", ".join(stale or DOCS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
