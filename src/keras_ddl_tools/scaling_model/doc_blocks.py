"""The model's figures in docs/scaling_model.md, written by the model.

Every table and figure of that page that the model computes sits between
two HTML comments::

    <!-- model:NAME -->
    ... generated ...
    <!-- /model:NAME -->

``python -m keras_ddl_tools.scaling_model --update-doc docs/scaling_model.md``
rewrites them, and a test fails when the page differs from what the model
gives now, so the prose around them never types a model figure. NAME is
one of BLOCKS below.
"""

import dataclasses
import re

from .links import MS, US
from .published import PUBLISHED, compare_published, overlap_needed
from .seeds import seeds_markdown, seeds_table
from .systems import SYSTEMS
from .training import predict
from .workloads import workload

BLOCK = re.compile(r"(<!-- model:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /model:(?P=name) -->)",
                   re.S)
# The overlap fractions of the sensitivity table around the fitted 0.7.
OVERLAP_GRID = (0.5, 0.6, 0.7, 0.8, 0.9)
KERAS_DDL_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)


def _pct(v):
    return f"{100 * v:.1f}"


def _short(point):
    """'Goyal ResNet-50', 'DDL ResNet-101/22k': a column header."""
    who = "Goyal" if point.system == "goyal2017" else "DDL"
    model = {"resnet50": "ResNet-50", "resnet101-22k": "ResNet-101/22k"}.get(point.model,
                                                                              point.model)
    return f"{who} {model}"


def published_markdown():
    """Published against predicted, each system with its own parameters,
    and the overlap fraction that would reproduce each point."""
    out = ["| point | GPUs | baseline | published | predicted | difference (points) | "
           "`f` this point needs |", "|---|---|---|---|---|---|---|"]
    for p, r in zip(PUBLISHED, compare_published()):
        out.append(f"| {p.label} | {p.gpus} | {p.baseline_gpus} | {100 * p.efficiency:.0f}% | "
                   f"{_pct(r['predicted'])}% | {r['diff_pts']:+.1f} | "
                   f"{overlap_needed(p):.2f} |")
    return "\n".join(out)


def overlap_markdown():
    """Predicted relative efficiency of each published point at 256 GPUs
    for overlap fractions around the one every system uses."""
    head = " | ".join(f"{_short(p)} ({100 * p.efficiency:.0f})" for p in PUBLISHED)
    out = [f"| f | {head} |", "|---" * (len(PUBLISHED) + 1) + "|"]
    for f in OVERLAP_GRID:
        systems = {k: v.with_(overlap_fraction=f) for k, v in SYSTEMS.items()}
        cells = [_pct(r["predicted"]) for r in compare_published(systems)]
        out.append(f"| {f:g} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def keras_ddl_markdown():
    """keras_ddl's system on GPU servers, ResNet-50: efficiency per
    algorithm and GPU count, with the hierarchical path's times."""
    system, work = SYSTEMS["keras_ddl"], workload("resnet50")
    algorithms = ("ring", "halving_doubling", "hierarchical")
    by = {(r.gpus, r.algorithm): r for r in predict(system, work, KERAS_DDL_GPUS, algorithms)}
    out = ["| GPUs | nodes | ring | halving_doubling | hierarchical | exposed ms (hierarchical) "
           "| comm ms/step (hierarchical) |", "|---|---|---|---|---|---|---|"]
    for n in KERAS_DDL_GPUS:
        h = by[(n, "hierarchical")]
        out.append(f"| {n} | {h.nodes} | " + " | ".join(_pct(by[(n, a)].efficiency)
                                                      for a in algorithms)
                   + f" | {h.exposed / MS:.1f} | {h.t_comm / MS:.1f} |")
    h = by[(KERAS_DDL_GPUS[0], "hierarchical")]
    out += ["", f"(compute {h.t_compute / MS:.1f} ms per step at batch {system.batch_per_gpu} "
                f"per GPU, {system.gpus_per_node} GPUs per server; {h.calls} fused calls per "
                "step.)"]
    return "\n".join(out)


def refit_markdown(fit):
    """One sentence: what the refit found, on what."""
    low, high = min(fit.residuals), max(fit.residuals)
    return (f"Link efficiency **{fit.link_efficiency:.3f}**, per-call overhead "
            f"**{fit.call_overhead / US:.0f} us**, from {len(fit.residuals)} observations "
            f"({fit.source}); measured / fitted within {100 * low:+.0f}% ... "
            f"{100 * high:+.0f}% (rms {100 * fit.rms:.0f}%).")


def sensitivity_markdown(setups):
    """ResNet-50 with the rack allreduce at 4:1 relative to one server, with
    one knob of the reference clusters changed at a time."""
    def cells(p100, h200):
        def pick(setup, system):
            (row,) = [r for r in seeds_table(setup) if r["model"] == "resnet50"
                      and r["system"] == system and r["algorithm"] == "three-level (racks)"]
            return row
        ratio = f"{p100.uplink_ratio:g}to1"
        gpu, pinned = pick(h200, "h200_gpu"), pick(h200, "h200_pinned")
        return (f"{_pct(pick(p100, 'p100_gpu')[f'rel_{ratio}'])} | {_pct(gpu[f'rel_{ratio}'])} | "
                f"{_pct(pinned[f'rel_{ratio}'])} ({_pct(pinned[f'abs_{ratio}'])})")

    p100, h200 = setups["p100"], setups["h200"]
    changes = [("as in the tables", {}),
               ("`--link-efficiency 0.7`", {"link_efficiency": 0.7}),
               ("`--link-efficiency 1.0`", {"link_efficiency": 1.0}),
               ("`--call-overhead 50` (CPU data plane at 50 us per call)",
                {"call_overhead": 50 * US}),
               ("`--call-overhead 1000`", {"call_overhead": 1000 * US}),
               ("`--overlap 0.5`", {"overlap_fraction": 0.5}),
               ("`--overlap 0.9`", {"overlap_fraction": 0.9})]
    out = ["| change | P100 `p100_gpu` | H200 `h200_gpu` | H200 `h200_pinned` (absolute) |",
           "|---|---|---|---|"]
    for label, knobs in changes:
        out.append(f"| {label} | " + cells(dataclasses.replace(p100, **knobs),
                                            dataclasses.replace(h200, **knobs)) + " |")
    return "\n".join(out)


def render_blocks(text, setups, fit, target=0.9, against="server"):
    """``text`` with every model block re-rendered; an unknown NAME is a
    KeyError naming it."""
    makers = {
        "published": published_markdown,
        "overlap": overlap_markdown,
        "keras-ddl": keras_ddl_markdown,
        "refit": lambda: refit_markdown(fit),
        "p100": lambda: seeds_markdown(setups["p100"], target, against),
        "h200": lambda: seeds_markdown(setups["h200"], target, against),
        "sensitivity": lambda: sensitivity_markdown(setups),
    }

    def body(match):
        name = match.group("name")
        if name not in makers:
            raise KeyError(f"unknown model block '{name}' (known: {', '.join(sorted(makers))})")
        return match.group(1) + makers[name]() + "\n" + match.group(4)
    return BLOCK.sub(body, text)


BLOCKS = ("published", "overlap", "keras-ddl", "refit", "p100", "h200", "sensitivity")
