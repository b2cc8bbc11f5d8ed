"""The refit of link efficiency and per-call overhead on the test cluster's
allreduce results (docs/results/{cluster,racks}_*.json, or the observations
transcribed in docs/model_data/)."""

import json
import math
import os
from dataclasses import dataclass

from ..checkout import repository
from ..rates import parse_rate
from .allreduce import pairwise_ring_cross
from .links import MS, Link
from .racks import three_level

REFIT_PATTERNS = ("cluster_*.json", "racks_*.json")
_OBSERVATIONS_IN_REPO = os.path.join("docs", "model_data", "cluster_observations.json")
# The checkout (an installed copy reads the one the command runs in).
_REPO = repository()
OBSERVATIONS = os.path.join(_REPO, _OBSERVATIONS_IN_REPO)
RESULTS_DIR = os.path.join(_REPO, "docs", "results")
# Sizes the refit takes: up to 16 KB (below the test cluster's 256 KB token
# bucket the link is not the limit, so the time is the per-call cost) and
# from 1 MB (the link is); in between the bucket lets part of a call through
# at once and neither term describes it.
REFIT_SMALL_BYTES = 16 << 10
REFIT_MIN_BYTES = 1 << 20
# Small calls tell the per-call cost only where the ranks do not queue for
# the machine's 2 cores: at 16 ranks a 4 KB call took 15 ms, the cores'
# time-sharing, not a cost a server with a core per rank would pay.
REFIT_SMALL_MAX_RANKS = 4


# The commits the results files were measured at before main's 0446f4a:
# their rack allreduce ran the lockstep schedule in an eighth of the call
# within 1-8 MiB (racks.rack_allreduce, schedule="lockstep"). A file
# measured at any other commit (the files re-measured under the same names
# from 0446f4a on) is taken to run the stages schedule of its time.
LOCKSTEP_COMMITS = frozenset({
    "6b9f4ab6b6ac3cda6d0bc341f3ba0d74e2585162",   # racks_2x4x1_4to1
    "30d6a2ec974097cbe19ad8e48bc15dbaa87c6b58",   # racks_2x4x1_1to1 (code of 6b9f4ab)
    "9235bbfb8c9ce8164c665499b9ea117fa857d25c",   # racks_2x8x1
})


def rack_schedule(commits):
    """'lockstep' when every commit a results file was measured at is one
    of LOCKSTEP_COMMITS, else 'stages'."""
    return "lockstep" if commits and set(commits) <= LOCKSTEP_COMMITS else "stages"


def _refit_size(nbytes):
    return nbytes <= REFIT_SMALL_BYTES or nbytes >= REFIT_MIN_BYTES


def _fit_bound(obs):
    """The links' share of an observation in the refit: none for the small
    calls the token bucket passes at once, observation_bound otherwise."""
    return 0.0 if obs["size"] <= REFIT_SMALL_BYTES else observation_bound(obs)


def _parse_shape(shape):
    """'KxL' -> (K nodes, L per node, 1 rack); 'RxNxL' -> (R*N, L, R)."""
    parts = [int(p) for p in shape.lower().split("x")]
    if len(parts) == 2:
        return parts[0], parts[1], 1
    return parts[0] * parts[1], parts[2], parts[0]


def observation_bound(obs):
    """The model's time for one observation's call with the links at their
    full rate and no latency or overhead: the algorithm's bytes over the
    links, fill and drain of the rack pipeline included; the rack
    allreduce in the observation's ``schedule`` (default: today's,
    "stages"), in pieces of its ``piece`` bytes if it records one (runs
    before the piece rule), else by that schedule's rule."""
    nodes, per_node, racks = _parse_shape(obs["shape"])
    node = Link(0.0, parse_rate(obs["rate"]) / 8)
    uplink = Link(0.0, parse_rate(obs["uplink"]) / 8) if obs.get("uplink") else None
    npr = nodes // racks if racks > 1 else 0
    if obs["path"] == "racks":
        return three_level(nodes, 1, obs["size"], node, node, uplink, npr,
                           piece=obs.get("piece"), schedule=obs.get("schedule", "stages"))
    if obs["path"] == "two_level":
        return pairwise_ring_cross(nodes, obs["size"], node, uplink, npr)
    raise ValueError(f"unknown path {obs['path']!r} (two_level or racks)")


def _size_bytes(key):
    from ..rates import parse_size
    return parse_size(key.replace("B", "b"), "size")


def observations_from_results(directory, files=None):
    """Observations from every docs/results file named cluster_*.json or
    racks_*.json in ``directory`` (or from ``files``), results of ``bench
    allreduce --cluster`` through ``keras_ddl_tools.results``: the first
    algorithm's median (auto: the rack allreduce with racks); sizes as
    REFIT_SMALL_BYTES / REFIT_MIN_BYTES say. With racks the two-level
    path's column (``flat``) stays out of the fit: across racks it reaches
    only 0.43-0.49 of its bound (measured, 2026-12-05), a loss of that
    path's many flows per uplink which the model does not describe, and
    one link efficiency for both would fit neither (all rows: residuals
    up to +72%). The rack rows carry the schedule their commit ran
    (rack_schedule). Files whose ranks were not told their racks
    (``topology_told`` false) stay out: their auto ran the chain."""
    import glob
    out = []
    paths = list(files) if files is not None else [
        p for pattern in REFIT_PATTERNS for p in sorted(glob.glob(os.path.join(directory,
                                                                               pattern)))]
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        launch = data["launches"][0]
        racks = int(launch.get("racks", 1) or 1)
        nodes, per_node = int(launch["nodes"]), int(launch["ranks_per_node"])
        shape = (f"{racks}x{nodes // racks}x{per_node}" if racks > 1
                 else f"{nodes}x{per_node}")
        if per_node != 1:
            continue   # the fit models one rank per node (no shared-memory stage)
        if launch.get("topology_told") is False:
            continue   # racks not told (--no-topology): auto ran the chain, not modelled
        schedule = rack_schedule(data.get("commits"))
        for row in data["tables"]["rows"]:
            size = _size_bytes(row["key"])
            if not _refit_size(size) or (size <= REFIT_SMALL_BYTES
                                         and nodes * per_node > REFIT_SMALL_MAX_RANKS):
                continue
            for column, path_name in [("auto_us", "racks" if racks > 1 else "two_level")]:
                if column not in row:
                    continue
                o = {"shape": shape, "rate": launch["rate"],
                     "uplink": launch.get("uplink") if racks > 1 else None,
                     "path": path_name, "size": size,
                     "time_s": row[column]["median"] / 1e6,
                     "launches": len(data["launches"]),
                     "source": f"docs/results/{os.path.basename(path)}, {column[:-3]}"}
                if path_name == "racks":
                    o["schedule"] = schedule
                out.append(o)
    return out


def load_observations(paths=None, results_dir=None):
    """(observations, where they came from): the results files matching
    REFIT_PATTERNS if any, else docs/model_data/cluster_observations.json;
    ``paths``: explicit JSON files of either kind."""
    if paths:
        obs = []
        for path in paths:
            with open(path) as f:
                data = json.load(f)
            if "observations" in data:
                obs += data["observations"]
            else:
                obs += observations_from_results(None, [path])
        return obs, ", ".join(paths)
    results_dir = results_dir or RESULTS_DIR
    obs = observations_from_results(results_dir)
    with open(OBSERVATIONS) as f:
        transcribed = json.load(f)["observations"]
    if not obs:
        return transcribed, "docs/model_data/cluster_observations.json"
    # Beside the results files, the transcribed rows of other shapes that
    # ran 3 launches or more on the quiet machine: the 2-node runs, where
    # every rank had a core, are what fixes the per-call cost.
    shapes = {o["shape"] for o in obs}
    quiet = [o for o in transcribed if o["shape"] not in shapes and o.get("launches", 1) >= 3]
    source = f"docs/results/{{{','.join(REFIT_PATTERNS)}}}"
    if quiet:
        source += " + docs/model_data/cluster_observations.json (" + ", ".join(
            sorted({o["shape"] for o in quiet})) + ")"
    return obs + quiet, source


@dataclass(frozen=True)
class Refit:
    link_efficiency: float    # fraction of the link rates the algorithms reach
    call_overhead: float      # s per call on top of the links' time
    residuals: tuple          # (measured / fitted - 1) per observation
    observations: tuple
    source: str

    @property
    def spread(self):
        """The largest |measured / fitted - 1|."""
        return max(abs(r) for r in self.residuals)

    @property
    def rms(self):
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals))


def refit(observations, source="given"):
    """Least squares of ``time = call_overhead + bound / link_efficiency``
    over the observations, each weighted by 1/time (relative errors), with
    ``bound`` the model's time at full link rate (observation_bound);
    call_overhead is kept >= 0."""
    obs = [o for o in observations if _refit_size(o["size"])]
    if len(obs) < 2:
        raise ValueError(f"the refit needs at least 2 observations (up to 16 KB or from "
                         f"1 MB), got {len(obs)}")
    xs = [_fit_bound(o) for o in obs]
    ts = [o["time_s"] for o in obs]
    if min(ts) <= 0:
        raise ValueError("every observed time must be positive")
    ws = [1 / t for t in ts]
    # weighted normal equations for t = c + b*x
    s11 = sum(w * w for w in ws)
    s12 = sum(w * w * x for w, x in zip(ws, xs))
    s22 = sum(w * w * x * x for w, x in zip(ws, xs))
    r1 = sum(w * w * t for w, t in zip(ws, ts))
    r2 = sum(w * w * x * t for w, x, t in zip(ws, xs, ts))
    det = s11 * s22 - s12 * s12
    if det <= 0:
        raise ValueError("the observations do not determine both parameters (one size only?)")
    c = (r1 * s22 - s12 * r2) / det
    b = (s11 * r2 - s12 * r1) / det
    if c < 0:   # no negative overhead: the best fit with c = 0
        c, b = 0.0, r2 / s22
    if b <= 0:
        raise ValueError(f"fitted time per bound second {b:.3g} <= 0")
    residuals = tuple(t / (c + b * x) - 1 for x, t in zip(xs, ts))
    return Refit(1 / b, c, residuals, tuple(obs), source)


def refit_rows(fit):
    rows = []
    for o, r in zip(fit.observations, fit.residuals):
        bound = _fit_bound(o)
        rows.append({"shape": o["shape"], "rates": o["rate"] + ("/" + o["uplink"]
                                                               if o.get("uplink") else ""),
                     "path": o["path"], "size_MB": o["size"] / 2**20,
                     "measured_ms": o["time_s"] / MS, "bound_ms": bound / MS,
                     "fitted_ms": (fit.call_overhead + bound / fit.link_efficiency) / MS,
                     "residual": f"{100 * r:+.1f}%", "launches": o.get("launches", "?")})
    return rows
