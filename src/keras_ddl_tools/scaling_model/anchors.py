"""The measured H200 figures (one H200: step times, gradient sizes, staging
copies, a CPU shared-memory allreduce probe), the parser of the file that
records them (docs/model_data/h200.md), and the staging and shared-memory
links derived from them."""

import os

from .links import MS, US, Link

# The file that records the figures, relative to the repository's root. The
# tools may run from an installed copy, which has no docs/, so the path is
# not resolved here.
ANCHORS_FILE = os.path.join("docs", "model_data", "h200.md")

# The figures of docs/model_data/h200.md (measured 2026-12-04 on one H200,
# outside this project's machines); a test parses the file and checks
# these, so they cannot drift from it.
H200_ANCHORS = {
    # (model, batch per GPU) -> median step in ms
    "step_ms": {("resnet50", 256): 41.0, ("resnet50", 32): 15.1,
                ("resnet101-22k", 256): 67.7, ("resnet101-22k", 32): 31.0},
    "gradient_bytes": {"resnet50": 102.3e6, "resnet101-22k": 349.2e6},
    # bytes -> ms for (device->host pageable, host->device pageable,
    #                  device->host pinned, host->device pinned)
    "staging_ms": {1e6: (0.14, 0.12, 0.044, 0.043), 16e6: (1.44, 1.53, 0.33, 0.34),
                   102e6: (8.2, 13.1, 1.98, 1.96), 349e6: (27.0, 43.4, 6.8, 6.6)},
    # ranks -> (ms for 102 MB, ms for 349 MB): the CPU shared-memory allreduce probe
    "shm_allreduce_ms": {2: (60.0, 97.0), 4: (39.0, 122.0), 8: (45.0, 157.0),
                         16: (57.0, 225.0)},
}

_MODEL_NAMES = {"ResNet-50": "resnet50", "ResNet-101": "resnet101-22k"}


def _md_rows(text, first_header):
    """The body rows (lists of cells) of the Markdown table whose header
    line starts with ``| first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.replace(" ", "").startswith(first_header.replace(" ", "")))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _first_number(cell):
    import re
    return float(re.match(r"\s*([\d.]+)", cell).group(1))


def parse_anchors(text):
    """The figures of docs/model_data/h200.md, in the shape of H200_ANCHORS."""
    out = {"step_ms": {}, "gradient_bytes": {}, "staging_ms": {}, "shm_allreduce_ms": {}}
    for cells in _md_rows(text, "| model | classes"):
        model = _MODEL_NAMES[cells[0]]
        out["step_ms"][(model, int(cells[2]))] = _first_number(cells[3])
        out["gradient_bytes"][model] = _first_number(cells[6]) * 1e6
    for cells in _md_rows(text, "| bytes | device->host"):
        out["staging_ms"][_first_number(cells[0]) * 1e6] = tuple(
            _first_number(c) for c in cells[1:5])
    for cells in _md_rows(text, "| ranks |"):
        out["shm_allreduce_ms"][int(cells[0])] = tuple(_first_number(c) for c in cells[1:3])
    return out


def _two_point_link(t_small, t_large, b_small, b_large):
    """alpha + bytes/bandwidth through two measured (bytes, seconds) points;
    a negative alpha (noise) is taken as 0."""
    bandwidth = (b_large - b_small) / (t_large - t_small)
    return Link(alpha=max(0.0, t_small - b_small / bandwidth), bandwidth=bandwidth)


def h200_staging(kind, anchors=H200_ANCHORS):
    """(device->host, host->device) Links from the measured 1 MB and 349 MB
    copies; ``kind`` is 'pageable' or 'pinned'."""
    col = {"pageable": 0, "pinned": 2}[kind]
    table = anchors["staging_ms"]
    small, large = min(table), max(table)
    return tuple(_two_point_link(table[small][col + i] * MS, table[large][col + i] * MS,
                                 small, large) for i in (0, 1))


def h200_shm_link(ranks=8, anchors=H200_ANCHORS):
    """The measured CPU shared-memory allreduce probe at ``ranks``
    ranks as the model's intra-node link: the bandwidth for which the
    ring's 2(L-1)/L x S per rank fits both measured sizes (least squares
    through the origin; 1 us latency assumed)."""
    t102, t349 = (t * MS for t in anchors["shm_allreduce_ms"][ranks])
    sizes = (anchors["gradient_bytes"]["resnet50"], anchors["gradient_bytes"]["resnet101-22k"])
    moved = [2 * (ranks - 1) / ranks * s for s in sizes]
    times = (t102, t349)
    per_byte = sum(m * t for m, t in zip(moved, times)) / sum(m * m for m in moved)
    return Link(alpha=1 * US, bandwidth=1 / per_byte)
