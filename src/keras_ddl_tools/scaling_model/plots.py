"""Plots (matplotlib, imported lazily): efficiency against GPUs with the
published points, and efficiency against link rate on the two reference clusters."""

import dataclasses
import warnings

from .published import PUBLISHED
from .seeds import SEED_MODELS, _systems_algorithms, seed_efficiency, seed_system
from .training import simulate_step
from .workloads import workload

def plot(path, system, work, gpus, rows, published_rows, systems):
    """Efficiency vs GPUs: the chosen system per algorithm, and the published
    systems' own configurations against their published points."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no plot written (pip install matplotlib)")
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for algorithm in sorted({r["algorithm"] for r in rows}):
        pts = [(r["gpus"], 100 * r["efficiency"]) for r in rows if r["algorithm"] == algorithm]
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=algorithm)
    left.set_title(f"{system.name}, {work.name}: predicted", fontsize=10)
    right_gpus = sorted(set(gpus) | {p["gpus"] for p in published_rows}
                        | {p.baseline_gpus for p in PUBLISHED})
    for point, row in zip(PUBLISHED, published_rows):
        s = systems[point.system]
        w = workload(point.model)
        base = simulate_step(s, w, point.baseline_gpus).efficiency
        xs = sorted({point.baseline_gpus} | {g for g in right_gpus if g >= point.baseline_gpus})
        ys = [100 * simulate_step(s, w, g).efficiency / base for g in xs]
        line, = right.plot(xs, ys, label=f"{point.system} / {point.model} (model)")
        right.scatter([point.gpus], [100 * point.efficiency], color=line.get_color(),
                      marker="*", s=160, zorder=3, edgecolor="black",
                      label=f"published {100 * point.efficiency:.0f}%")
    right.set_title("published systems with their own parameters, relative to one server",
                    fontsize=10)
    for ax, low in ((left, 0), (right, 50)):
        ax.set_xscale("log", base=2)
        ticks = sorted(set(gpus) | set(right_gpus)) if ax is right else sorted(set(gpus))
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_ylim(low, 101)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("alpha-beta scaling model (python -m keras_ddl.bench model)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def seeds_plot(path, setups, target=0.9):
    """Efficiency against the per-server link rate, one panel per setup,
    solid at 1:1 and dashed at the setup's oversubscription: P100 relative
    to one server (PowerAI DDL's published 95% marked), H200 absolute
    (against one GPU without communication), so the CPU data plane's loss
    inside a server shows. ResNet-101/22k thin, ResNet-50 thick."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no plot written (pip install matplotlib)")
        return False
    fig, axes = plt.subplots(1, len(setups), figsize=(6.4 * len(setups), 5.0))
    axes = list(axes) if len(setups) > 1 else [axes]
    rates = [10 ** (8.5 + 0.125 * i) for i in range(33)]   # 0.3 Gbit/s ... 3.2 Tbit/s
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, setup in zip(axes, setups):
        gpus = setup.servers * setup.gpus_per_server
        against = "server" if setup.seeds == "p100" else "gpu"
        combos = [c for c in _systems_algorithms(setup.seeds) if c[1] != "two-level, ring"]
        for model in SEED_MODELS[setup.seeds]:
            work = workload(model)
            thick = model == "resnet50"
            for i, (name, label, algorithm, cross) in enumerate(combos):
                color = palette[i % len(palette)]
                for ratio, style in ((1.0, "-"), (setup.uplink_ratio, "--")):
                    s = dataclasses.replace(setup, uplink_ratio=ratio)
                    ys = [100 * seed_efficiency(seed_system(name, s, node_rate=r), work, gpus,
                                                algorithm, cross, against) for r in rates]
                    kw = {"label": f"{model}, {name}, {label}"} if ratio == 1.0 else {}
                    ax.plot([r / 1e9 for r in rates], ys, style, color=color,
                            lw=2.0 if thick else 0.9, **kw)
        ax.axhline(100 * target, color="grey", lw=0.8)
        ax.axvline(setup.rate() / 1e9, color="grey", lw=0.8, ls=":")
        if setup.seeds == "p100":
            ax.scatter([100], [95], marker="*", s=180, color="gold", edgecolor="black",
                       zorder=3, label="PowerAI DDL 2017, published 95% (EDR, 100 Gbit/s)")
        ax.set_xscale("log")
        ax.set_xlabel("link rate per server, Gbit/s each way")
        ax.set_ylabel("efficiency relative to one server (%)" if against == "server"
                      else "efficiency against one GPU alone (%)")
        ax.set_ylim(0, 101)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{setup.servers} servers x {setup.gpus_per_server} "
                     f"{setup.seeds.upper()}, racks of {setup.rack_nodes()}: solid 1:1, "
                     f"dashed {setup.uplink_ratio:g}:1", fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("scaling model, two reference clusters (python -m "
                 "keras_ddl_tools.scaling_model --reference-plot)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
