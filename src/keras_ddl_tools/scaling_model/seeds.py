"""Two reference clusters, PowerAI DDL's (64 servers x 4 P100) and 32
servers x 8 H200: flat / two-level / three-level, their tables and the link
rates that reach a target efficiency, as Markdown for docs/scaling_model.md.
(The module keeps its first name, "seeds": the two clusters the model was
first asked to predict.)"""

import dataclasses
import math
from dataclasses import dataclass

from .anchors import H200_ANCHORS, h200_shm_link, h200_staging
from .links import GB, MS, US, Link
from .published import compare_published
from .systems import OVERLAP_FRACTION, P100_RESNET50_STEP, SYSTEMS, System
from .training import simulate_step
from .workloads import workload

@dataclass(frozen=True)
class SeedSetup:
    """The knobs of one reference cluster's prediction."""
    seeds: str = "p100"            # p100: 64 servers x 4 P100; h200: 32 servers x 8 H200
    node_rate: float = None        # bits/s each way per server (default 100 Gb/s / 400 Gb/s)
    nodes_per_rack: int = None     # default 16 (P100) / 8 (H200)
    uplink_ratio: float = 4.0      # oversubscription: nodes_per_rack x node rate / uplink rate
    batch: int = None              # per GPU: 32 (P100) / 256 (H200)
    link_efficiency: float = 0.9
    call_overhead: float = None    # s per call for CPU data plane systems (None: refit's / 50 us)
    gpu_call_overhead: float = 50 * US
    overlap_fraction: float = OVERLAP_FRACTION

    @property
    def servers(self):
        return 64 if self.seeds == "p100" else 32

    @property
    def gpus_per_server(self):
        return 4 if self.seeds == "p100" else 8

    def rate(self):
        return self.node_rate or (100e9 if self.seeds == "p100" else 400e9)

    def rack_nodes(self):
        return self.nodes_per_rack or (16 if self.seeds == "p100" else 8)

    def per_gpu_batch(self):
        return self.batch or (32 if self.seeds == "p100" else 256)


SEED_SYSTEMS = {"p100": ("p100_gpu", "p100_cpu"),
                "h200": ("h200_gpu", "h200_pinned", "h200_pageable")}
SEED_MODELS = {"p100": ("resnet50",), "h200": ("resnet50", "resnet101-22k")}
# (label, algorithm, cross): flat = one ring over every GPU; two-level =
# NVLink / shared memory in the server and keras_ddl's pairwise step
# across servers (or a ring); three-level = the rack allreduce
SEED_ALGORITHMS = (("flat ring", "ring", "ring"),
                   ("two-level, pairwise", "hierarchical", "pairwise"),
                   ("two-level, ring", "hierarchical", "ring"),
                   ("three-level (racks)", "racks", "pairwise"))


def seed_system(name, setup, node_rate=None, uplink_rate=None):
    """One of the SEED_SYSTEMS as a System, its network at ``node_rate``
    bits/s per server (default the setup's) and rack uplinks at
    ``uplink_rate`` (default nodes_per_rack x node rate / uplink_ratio),
    both times the link efficiency."""
    rate = node_rate or setup.rate()
    npr = setup.rack_nodes()
    uplink_rate = uplink_rate or npr * rate / setup.uplink_ratio
    eff = setup.link_efficiency
    inter = Link(alpha=3 * US, bandwidth=rate / 8 * eff)
    uplink = Link(alpha=3 * US, bandwidth=uplink_rate / 8 * eff)
    cpu_overhead = setup.call_overhead if setup.call_overhead is not None else 50 * US
    batch = setup.per_gpu_batch()
    common = dict(inter=inter, uplink=uplink, nodes_per_rack=npr, algorithm="racks",
                  cross="pairwise", fusion="cycle", fusion_bytes=128 * 2**20, cycle=1 * MS,
                  negotiation=True, batch_per_gpu=batch,
                  overlap_fraction=setup.overlap_fraction)
    if name.startswith("p100"):
        common.update(gpus_per_node=4, resnet50_step=P100_RESNET50_STEP * batch / 32)
        if name == "p100_gpu":
            return System(name=name, description="64 x 4 P100 (PowerAI DDL's servers), GPU "
                          "data plane: NVLink in the server, EDR-class InfiniBand across",
                          intra=Link(alpha=5 * US, bandwidth=20 * GB),
                          call_overhead=setup.gpu_call_overhead, **common)
        return System(name=name, description="64 x 4 P100, keras_ddl's CPU data plane: "
                      "gradients staged to POWER8 memory over NVLink, shared memory in the "
                      "server", intra=SYSTEMS["keras_ddl"].intra,
                      staging=Link(alpha=10 * US, bandwidth=32 * GB), staging_in_node=True,
                      call_overhead=cpu_overhead, **common)
    steps = tuple((m, H200_ANCHORS["step_ms"][(m, batch)] * MS) for m in SEED_MODELS["h200"]
                  if (m, batch) in H200_ANCHORS["step_ms"])
    if not steps:
        raise ValueError(f"the H200 measurements have batch 32 and 256 per GPU, not {batch}")
    common.update(gpus_per_node=8, resnet50_step=dict(steps)["resnet50"], steps=steps)
    if name == "h200_gpu":
        return System(name=name, description="32 x 8 H200, GPU data plane: NVLink in the "
                      "server (assumed 360 GB/s per direction), network across",
                      intra=Link(alpha=5 * US, bandwidth=360 * GB),
                      call_overhead=setup.gpu_call_overhead, **common)
    d2h, h2d = h200_staging(name.split("_")[1])
    return System(name=name, description=f"32 x 8 H200, keras_ddl's CPU data plane: "
                  f"{name.split('_')[1]} staging (measured), shared memory in the server "
                  "(the measured 8-rank probe)", intra=h200_shm_link(8), staging=d2h,
                  staging_back=h2d, staging_in_node=True, call_overhead=cpu_overhead, **common)


def seed_efficiency(system, work, gpus, algorithm, cross, against="server"):
    """Efficiency at ``gpus``; ``against`` 'server': relative to one server
    (as PowerAI and Goyal et al. report), 'gpu': absolute."""
    s = system.with_(cross=cross)
    at = simulate_step(s, work, gpus, algorithm).efficiency
    if against == "gpu":
        return at
    return at / simulate_step(s, work, system.gpus_per_node, algorithm).efficiency


def solve_rate(efficiency_at, target, lo=1e8, hi=1e14, rel_tol=1e-3):
    """The lowest rate (bits/s, bisection on a log scale) at which
    ``efficiency_at(rate) >= target``, assuming efficiency does not fall as
    the rate rises; None when even ``hi`` does not reach it, ``lo`` when
    ``lo`` already does."""
    if efficiency_at(hi) < target:
        return None
    if efficiency_at(lo) >= target:
        return lo
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if efficiency_at(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def _systems_algorithms(seeds):
    """(system name, label, algorithm, cross) rows of a seeds table: every
    algorithm on the GPU data plane, the one keras_ddl picks with racks on
    the CPU data plane."""
    rows = []
    for name in SEED_SYSTEMS[seeds]:
        algos = SEED_ALGORITHMS if name.endswith("_gpu") else (SEED_ALGORITHMS[-1],)
        rows += [(name, label, a, c) for label, a, c in algos]
    return rows


def seeds_table(setup):
    """Efficiency of each system and algorithm at the seeds' scale, at 1:1
    and at the setup's oversubscription."""
    gpus = setup.servers * setup.gpus_per_server
    rows = []
    for model in SEED_MODELS[setup.seeds]:
        work = workload(model)
        for name, label, algorithm, cross in _systems_algorithms(setup.seeds):
            one = seed_system(name, dataclasses.replace(setup, uplink_ratio=1.0))
            over = seed_system(name, setup)
            t = one.step_compute(work)
            rows.append({
                "model": model, "system": name, "algorithm": label,
                "step_ms": t / MS,
                "one_server": seed_efficiency(one, work, one.gpus_per_node, algorithm, cross,
                                              "gpu"),
                "rel_1to1": seed_efficiency(one, work, gpus, algorithm, cross),
                f"rel_{setup.uplink_ratio:g}to1": seed_efficiency(over, work, gpus, algorithm,
                                                                  cross),
                "abs_1to1": seed_efficiency(one, work, gpus, algorithm, cross, "gpu"),
                f"abs_{setup.uplink_ratio:g}to1": seed_efficiency(over, work, gpus, algorithm,
                                                                  cross, "gpu")})
    return rows


def seeds_rates(setup, target=0.9, against="server"):
    """Per system and algorithm: the server link rate reaching ``target`` at
    1:1 and at the setup's oversubscription (uplinks scale with it), and
    the uplink rate reaching it with the servers at the setup's rate."""
    gpus = setup.servers * setup.gpus_per_server
    rows = []
    npr = setup.rack_nodes()
    for model in SEED_MODELS[setup.seeds]:
        work = workload(model)
        for name, label, algorithm, cross in _systems_algorithms(setup.seeds):
            def at_ratio(ratio):
                s = dataclasses.replace(setup, uplink_ratio=ratio)
                return lambda r: seed_efficiency(seed_system(name, s, node_rate=r), work, gpus,
                                                 algorithm, cross, against)
            uplink = solve_rate(lambda u: seed_efficiency(
                seed_system(name, setup, uplink_rate=u), work, gpus, algorithm, cross,
                against), target)
            def absolute(r):
                s = seed_system(name, setup, node_rate=r)
                return seed_efficiency(s, work, gpus, algorithm, cross, "gpu")
            rows.append({"model": model, "system": name, "algorithm": label,
                         "server_1to1": solve_rate(at_ratio(1.0), target),
                         f"server_{setup.uplink_ratio:g}to1_absolute": solve_rate(absolute,
                                                                                  target),
                         f"server_{setup.uplink_ratio:g}to1": solve_rate(
                             at_ratio(setup.uplink_ratio), target),
                         "uplink": uplink,
                         "uplink_ratio": (None if uplink is None
                                          else npr * setup.rate() / uplink)})
    return rows


def _gbit(rate):
    if rate is None:
        return "not reached"
    if rate <= 1e8:
        return "<= 0.1"
    return f"{rate / 1e9:.3g}"


def seeds_markdown(setup, target=0.9, against="server"):
    """A reference cluster's tables as Markdown (what docs/scaling_model.md shows)."""
    ratio = f"{setup.uplink_ratio:g}:1"
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    size = f"{setup.servers} x {setup.gpus_per_server}"
    out = [f"| model | system | algorithm | step (ms) | one server (absolute) | {size}, 1:1 | "
           f"{size}, {ratio} | {size}, {ratio}, absolute |", "|---|---|---|---|---|---|---|---|"]
    for r in seeds_table(setup):
        out.append(f"| {r['model']} | {r['system']} | {r['algorithm']} | {r['step_ms']:.1f} | "
                   f"{pct(r['one_server'])} | {pct(r['rel_1to1'])} | "
                   f"{pct(r[f'rel_{setup.uplink_ratio:g}to1'])} | "
                   f"{pct(r[f'abs_{setup.uplink_ratio:g}to1'])} |")
    if setup.seeds == "p100":
        (ddl,) = [r for r in compare_published() if r["system"] == "powerai_ddl2017"
                  and r["model"] == "resnet50"]
        out += ["", f"PowerAI DDL 2017 on the same cluster (ResNet-50, 256 GPUs against one "
                    f"server): published {pct(ddl['published'])}%; its own system in this "
                    f"model (`powerai_ddl2017`: multi-ring across 64 servers, a call per "
                    f"layer, staging through POWER8 memory, no racks) {pct(ddl['predicted'])}%."]
    basis = "relative to one server" if against == "server" else "absolute (against one GPU)"
    out += ["", f"Link rate for {100 * target:g}% ({basis}; last column absolute), Gbit/s "
                "each way:", "",
            f"| model | system | algorithm | per server, 1:1 | per server, {ratio} | "
            f"uplink with servers at {setup.rate() / 1e9:g} | = oversubscription | "
            f"per server, {ratio}, absolute |", "|---|---|---|---|---|---|---|---|"]
    for r in seeds_rates(setup, target, against):
        ov = "-" if r["uplink_ratio"] is None else f"{r['uplink_ratio']:.3g}:1"
        out.append(f"| {r['model']} | {r['system']} | {r['algorithm']} | "
                   f"{_gbit(r['server_1to1'])} | "
                   f"{_gbit(r[f'server_{setup.uplink_ratio:g}to1'])} | {_gbit(r['uplink'])} | "
                   f"{ov} | {_gbit(r[f'server_{setup.uplink_ratio:g}to1_absolute'])} |")
    return "\n".join(out)
