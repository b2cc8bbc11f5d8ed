"""Text output: fixed-width tables and a system's parameters."""

from .links import GB, MS, US

TABLE_COLUMNS = ["gpus", "nodes", "algorithm", "calls", "t_compute_ms", "t_comm_ms",
                 "exposed_ms", "allreduce_ms", "efficiency"]
PUBLISHED_COLUMNS = ["point", "gpus", "baseline", "published", "predicted", "diff_pts",
                     "within_5", "overlap_needed"]


def _fmt(value):
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def format_table(title, columns, rows):
    cells = [[_fmt(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = [f"# {title}", "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def parameter_rows(system):
    def link(l):
        return "-" if l is None else f"alpha {l.alpha / US:g} us, {l.bandwidth / GB:.3g} GB/s"
    return [
        {"parameter": "GPUs per node", "value": str(system.gpus_per_node)},
        {"parameter": "intra-node link", "value": link(system.intra)},
        {"parameter": "inter-node link (per node)", "value": link(system.inter)},
        {"parameter": "device<->host staging",
         "value": link(system.staging) + (" (in a node too)" if system.staging is not None
                                          and system.staging_in_node else "")},
        {"parameter": "compute per step (ResNet-50)",
         "value": f"{system.resnet50_step / MS:.1f} ms at batch {system.batch_per_gpu}/GPU"},
        {"parameter": "calls", "value": f"fusion={system.fusion}"
                                        + (f", {system.fusion_bytes >> 20} MB, cycle "
                                           f"{system.cycle / MS:g} ms" if system.fusion == "cycle"
                                           else "")
                                        + f", {system.call_overhead / US:g} us each"
                                        + (", negotiated" if system.negotiation else "")},
        {"parameter": "hierarchical cross-node algorithm", "value": system.cross},
        {"parameter": "backward share of compute", "value": f"{system.backward_fraction:.3g}"},
        {"parameter": "overlap fraction", "value": f"{system.overlap_fraction:g}"},
    ]
