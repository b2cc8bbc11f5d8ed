"""Published points (Goyal et al. 2017, PowerAI DDL 2017) against the
model's predictions for the same systems, and the overlap fraction each
point needs."""

from dataclasses import dataclass

from .systems import SYSTEMS
from .training import simulate_step
from .workloads import workload

@dataclass(frozen=True)
class PublishedPoint:
    label: str
    system: str
    model: str
    gpus: int
    baseline_gpus: int    # the published efficiency is relative to this many GPUs (one server)
    efficiency: float
    source: str


PUBLISHED = (
    PublishedPoint("Goyal et al. 2017, ResNet-50, batch 8192", "goyal2017", "resnet50",
                   256, 8, 0.90,
                   "arXiv:1706.02677 abstract: ~90% scaling efficiency from 8 to 256 GPUs"),
    PublishedPoint("PowerAI DDL 2017, ResNet-50 (Caffe)", "powerai_ddl2017", "resnet50",
                   256, 4, 0.95,
                   "IBM Research blog, Aug 2017 / arXiv:1708.02188: 95% on 256 GPUs"),
    PublishedPoint("PowerAI DDL 2017, ResNet-101, ImageNet-22k", "powerai_ddl2017",
                   "resnet101-22k", 256, 4, 0.88,
                   "arXiv:1708.02188: 88% on 256 GPUs (16 days on 4 GPUs -> 7 h on 256)"),
)


def compare_published(systems=None, points=PUBLISHED):
    """Predicted vs published efficiency, relative to one server as the
    papers report it: ``efficiency(gpus) / efficiency(baseline_gpus)``."""
    systems = systems or SYSTEMS
    rows = []
    for p in points:
        system = systems[p.system]
        work = workload(p.model)
        at = simulate_step(system, work, p.gpus)
        base = simulate_step(system, work, p.baseline_gpus)
        predicted = at.efficiency / base.efficiency
        rows.append({"point": p.label, "system": p.system, "model": p.model, "gpus": p.gpus,
                     "baseline": p.baseline_gpus, "published": p.efficiency,
                     "predicted": predicted, "predicted_abs": at.efficiency,
                     "diff_pts": 100 * (predicted - p.efficiency),
                     "within_5": abs(predicted - p.efficiency) <= 0.05})
    return rows


def overlap_needed(point, systems=None, resolution=0.01):
    """The overlap fraction for which this point's prediction is closest to
    the published value (a diagnostic of how consistent the points are)."""
    systems = systems or SYSTEMS
    work = workload(point.model)
    at = simulate_step(systems[point.system], work, point.gpus)
    base = simulate_step(systems[point.system], work, point.baseline_gpus)
    return _closest_fraction(lambda f: at.efficiency_at(f) / base.efficiency_at(f),
                             point.efficiency, resolution)


def _closest_fraction(efficiency_at, target, resolution=0.01):
    """The overlap fraction on a grid of ``resolution`` in [0, 1] whose
    predicted efficiency ``efficiency_at(f)`` is closest to ``target``."""
    steps = int(round(1 / resolution))
    fractions = [i / steps for i in range(steps + 1)]
    return min(fractions, key=lambda f: abs(efficiency_at(f) - target))
