"""The overlap this repository measures on its own test cluster: the model of
``python -m keras_ddl.bench fit --cluster 2`` and the overlap fraction that
reproduces each efficiency of its results."""

import dataclasses

from .links import MS, US, Link
from .published import _closest_fraction
from .systems import LOCAL_SHM_DEFAULT, System
from .training import simulate_step
from .workloads import workload

def test_cluster_system(link_bits_per_s, step_s, link_efficiency=0.94):
    """The cluster of ``python -m keras_ddl.bench fit --cluster 2``: two
    network namespaces of one rank each (one CPU core, one TF thread), a
    shaped link between them, keras_ddl's flat path. ``link_efficiency`` is
    the fraction of the link rate a 64 MB allreduce reaches there
    (docs/performance-notes/2026-12-03-cluster-allreduce.md); ``step_s`` the
    measured one-rank step."""
    return System(
        name="netns_cluster",
        description=f"2 network namespaces x 1 CPU rank, {link_bits_per_s / 1e9:g} Gbit/s "
                    "links, keras_ddl flat path over MPI/TCP",
        gpus_per_node=1,
        intra=LOCAL_SHM_DEFAULT,
        inter=Link(alpha=100 * US, bandwidth=link_bits_per_s / 8 * link_efficiency),
        resnet50_step=step_s,
        batch_per_gpu=8,
        algorithm="ring", fusion="cycle", fusion_bytes=64 * 2**20, cycle=1 * MS,
        negotiation=True,
        sources=("python -m keras_ddl.bench fit --cluster 2 "
                 "(docs/performance-notes/2026-12-04-fit-across-nodes.md)",))


def half_precision_wire(work):
    """``work`` with every gradient sent in 16 bits (Compression.fp16)."""
    return dataclasses.replace(work, name=work.name + " fp16 wire", tensors=tuple(
        dataclasses.replace(t, nbytes=t.nbytes // 2) for t in work.tensors))


def overlap_from_fit(fit, link_bits_per_s, model="resnet50"):
    """The overlap fraction that reproduces each measured weak-scaling
    efficiency of a ``bench fit --cluster 2 --json`` result (``fit``: its
    parsed JSON), with the model's bounds: efficiency without any overlap
    (f = 0) and with all of it (f = 1). Rows with overlap off have f = 0 by
    construction and are skipped.

    The model describes communication only. A result with the control run
    (``communication``: independent ranks' step / distributed step) is
    fitted on that, with the independent step as the compute time, so what
    the ranks cost each other through the machine does not pass for
    communication that failed to hide; an older result without it is
    fitted on ``efficiency`` against the one-rank step."""
    rows = []
    for r in fit["rows"]:
        if "2x1_ms" not in r:
            raise ValueError("the overlap fit models 2 nodes x 1 rank; this result has no "
                             f"2x1_ms column (columns: {', '.join(r)})")
        if r["overlap"] != "on":
            continue
        work = workload(model)
        if r["wire"] != "fp32":
            work = half_precision_wire(work)
        controlled = "communication" in r
        measured = r["communication"] if controlled else r["efficiency"]
        compute_ms = r["2x1_indep_ms"] if controlled else r["1rank_ms"]
        system = test_cluster_system(link_bits_per_s, compute_ms * MS)
        at = simulate_step(system, work, 2)
        rows.append({"overlap": r["overlap"], "wire": r["wire"],
                     "against": "independent" if controlled else "1 rank", "measured": measured,
                     "model_f0": at.efficiency_at(0.0), "model_f1": at.efficiency_at(1.0),
                     "fitted_f": _closest_fraction(at.efficiency_at, measured)})
    return rows
