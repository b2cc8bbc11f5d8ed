"""One training step: the allreduce a call uses and what the call costs,
the calls of a step (fusion into buckets), the communication stream and the
exposed time, hence the efficiency."""

import math
from dataclasses import dataclass

from .allreduce import flat_halving_doubling, flat_ring, hierarchical
from .links import MS, _rack_count
from .racks import three_level
from .systems import FUSION_POLICIES

ALGORITHMS = ("ring", "halving_doubling", "hierarchical")


def allreduce_time(algorithm, n, local, nbytes, intra, inter, cross="ring", uplink=None,
                   nodes_per_rack=0):
    """Seconds for one allreduce of nbytes on n ranks, local ranks per node;
    ``uplink`` and ``nodes_per_rack`` describe racks (None / 0: one switch)."""
    if algorithm == "ring":
        return flat_ring(n, local, nbytes, intra, inter, uplink, nodes_per_rack)
    if algorithm == "halving_doubling":
        if uplink is not None and _rack_count(max(1, n // local), nodes_per_rack) > 1:
            raise ValueError("halving_doubling is not modelled behind rack uplinks")
        return flat_halving_doubling(n, local, nbytes, intra, inter)
    if algorithm == "hierarchical":
        return hierarchical(n, local, nbytes, intra, inter, cross=cross, uplink=uplink,
                            nodes_per_rack=nodes_per_rack)
    if algorithm == "racks":
        return three_level(n, local, nbytes, intra, inter, uplink, nodes_per_rack)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose from "
                     f"{', '.join(ALGORITHMS + ('racks',))}")


def buckets(system, work, t_compute):
    """[(ready_time, nbytes)] of the collective calls of one step, in order.

    Time 0 is the start of the step; the backward pass occupies the last
    ``backward_fraction`` of ``t_compute``."""
    t_back0 = (1 - system.backward_fraction) * t_compute
    timed = [(t_back0 + t.ready * system.backward_fraction * t_compute, t.nbytes)
             for t in work.tensors]
    policy = system.fusion
    if policy == "tensor":
        return timed
    if policy == "single":
        return [(t_compute, sum(b for _, b in timed))]
    if policy == "layer":
        out = []
        for ready, nbytes in timed:
            if out and out[-1][0] == ready:
                out[-1] = (ready, out[-1][1] + nbytes)
            else:
                out.append((ready, nbytes))
        return out
    if policy == "cycle":
        if system.cycle <= 0:
            raise ValueError("fusion='cycle' needs cycle > 0")
        groups = {}
        for ready, nbytes in timed:
            tick = math.ceil(ready / system.cycle - 1e-9) * system.cycle
            groups.setdefault(tick, []).append(nbytes)
        out = []
        limit = system.fusion_bytes
        for tick in sorted(groups):
            size = 0
            for nbytes in groups[tick]:
                if size and limit and size + nbytes > limit:
                    out.append((tick, size))
                    size = 0
                size += nbytes
            out.append((tick, size))
        return out
    raise ValueError(f"unknown fusion policy {policy!r}; choose from {', '.join(FUSION_POLICIES)}")


def call_time(system, algorithm, n, nbytes):
    """One collective call on its own: software overhead, negotiation,
    staging copies and the allreduce itself."""
    if n == 1:
        return 0.0
    nodes = max(1, n // system.gpus_per_node)
    t = system.call_overhead
    t += allreduce_time(algorithm, n, system.gpus_per_node, nbytes, system.intra,
                        system.inter, cross=system.cross, uplink=system.uplink,
                        nodes_per_rack=system.nodes_per_rack)
    if system.negotiation:
        link = system.inter if nodes > 1 else system.intra
        t += 2 * math.ceil(math.log2(n)) * link.alpha
    if system.staging is not None and (nodes > 1 or system.staging_in_node):
        t += system.staging.cost(nbytes) + (system.staging_back or system.staging).cost(nbytes)
    return t


@dataclass
class StepResult:
    gpus: int
    nodes: int
    algorithm: str
    calls: int
    t_compute: float
    t_comm: float       # standalone durations of all collective calls of the step, summed
    exposed: float      # communication time left after the backward pass ends
    allreduce_once: float   # the whole gradient in one call, for reference
    tail: float = 0.0       # ideal schedule: communication after the backward pass
    hideable: float = 0.0   # ideal schedule: communication during the backward pass

    def exposed_at(self, overlap_fraction):
        """Exposed time for another overlap fraction (same schedule)."""
        if self.gpus == 1:
            return 0.0
        return self.tail + (1 - overlap_fraction) * self.hideable

    def efficiency_at(self, overlap_fraction):
        return self.t_compute / (self.t_compute + self.exposed_at(overlap_fraction))

    @property
    def efficiency(self):
        return self.t_compute / (self.t_compute + self.exposed)

    def row(self):
        return {"gpus": self.gpus, "nodes": self.nodes, "algorithm": self.algorithm,
                "calls": self.calls, "t_compute_ms": self.t_compute / MS,
                "t_comm_ms": self.t_comm / MS, "exposed_ms": self.exposed / MS,
                "allreduce_ms": self.allreduce_once / MS, "efficiency": self.efficiency}


def simulate_step(system, work, n, algorithm=None):
    """One training step on n GPUs.

    The collective calls run through one communication stream, one at a
    time, in the order they become ready (as in keras_ddl's background
    thread); a call starts when it is ready and the previous one is done.
    In that ideal schedule, the part of the communication that runs before
    the backward pass ends is hideable; ``overlap_fraction`` of it is
    hidden and the rest is exposed, together with everything that runs
    after the backward pass."""
    algorithm = algorithm or system.algorithm
    t_compute = system.step_compute(work)
    nodes = max(1, n // system.gpus_per_node)
    calls = buckets(system, work, t_compute)
    end = 0.0
    busy = 0.0
    for ready, nbytes in calls:
        d = call_time(system, algorithm, n, nbytes)
        end = max(end, ready) + d
        busy += d
    tail = max(0.0, end - t_compute)
    hideable = busy - tail
    exposed = tail + (1 - system.overlap_fraction) * hideable if n > 1 else 0.0
    once = call_time(system, algorithm, n, work.nbytes)
    return StepResult(n, nodes, algorithm, len(calls), t_compute, busy, exposed, once,
                      tail, hideable)


def predict(system, work, gpus, algorithms=ALGORITHMS):
    return [simulate_step(system, work, n, a) for n in gpus for a in algorithms]
