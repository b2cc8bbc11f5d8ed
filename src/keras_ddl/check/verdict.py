"""The check's rules, as pure functions of what the ranks measured, so
that they can be tested on made-up numbers without launching anything.

A rank's record (``RankRecord``) holds its place, its /dev/shm, its probe
port and its DDL_* settings; the links are each node's best measured pair rate."""

import statistics
from dataclasses import dataclass, field

MIB = 1 << 20
# The node allreduce's staging area: 4 slots per local rank, a slot of at
# most 4 MiB (custom_ops/engine/context.cc; docs/knobs.md, DDL_SHM_ARENA_MB).
STAGING_SLOTS = 4
LARGEST_SLOT = 4 * MIB
# A node whose best link is below this share of the nodes' median is slow.
SLOW_SHARE = 0.5
# Settings a launcher gives each rank its own value of: not a mismatch.
PER_RANK_SETTINGS = frozenset({"DDL_LOCAL_RANK", "DDL_RANK"})


@dataclass
class RankRecord:
    host: str
    rank: int
    local_rank: int
    local_size: int
    gpu: str = "none"
    rack: str = ""
    rack_source: str = ""
    shm_free: int = 0  # bytes free in /dev/shm before init
    probe_port: int = 0  # the TCP port its process answers probes on; 0: none
    settings: dict = field(default_factory=dict)  # the rank's DDL_* environment


def shm_needed(local_size, settings):
    """Bytes of /dev/shm a node's ranks commit at init for the node
    allreduce: none on one rank a node or with DDL_ALLREDUCE=flat, else the
    staging area, capped by DDL_SHM_ARENA_MB when that is set."""
    if local_size <= 1 or settings.get("DDL_ALLREDUCE", "auto") == "flat":
        return 0
    need = STAGING_SLOTS * LARGEST_SLOT * local_size
    cap = settings.get("DDL_SHM_ARENA_MB", "0")
    try:
        cap_bytes = int(float(cap) * MIB)
    except ValueError:
        cap_bytes = 0  # init has already refused a value it cannot read
    return min(need, cap_bytes) if cap_bytes > 0 else need


def slow_nodes(node_rates):
    """{host: best pair rate}: the hosts below SLOW_SHARE of the median.
    A node's best pair is bounded by its own link, so one slow link makes
    one node slow here, not the peers it was measured with. Needs 3 nodes:
    with 2, the one pair cannot say which end is slow."""
    if len(node_rates) < 3:
        return []
    median = statistics.median(node_rates.values())
    return sorted(h for h, r in node_rates.items() if r < SLOW_SHARE * median)


def problems(records, node_rates):
    """The verdict: one line per problem found (empty when none).
    ``records``: a RankRecord per rank; ``node_rates``: {host: bytes/s}."""
    found = []
    median = statistics.median(node_rates.values()) if node_rates else 0
    for host in slow_nodes(node_rates):
        found.append(f"slow link: node {host} reaches its peers at "
                     f"{node_rates[host] / 1e6:.1f} MB/s at best, below half the nodes' "
                     f"median of {median / 1e6:.1f} MB/s")
    with_rack = [r for r in records if r.rack]
    if with_rack:
        for r in records:
            if not r.rack:
                found.append(f"no rack: rank {r.rank} on {r.host} has no rack while rank "
                             f"{with_rack[0].rank} on {with_rack[0].host} is in rack "
                             f"{with_rack[0].rack} ({with_rack[0].rack_source})")
    seen = set()
    for r in records:
        need = shm_needed(r.local_size, r.settings)
        if r.host not in seen and r.shm_free < need:
            seen.add(r.host)
            found.append(f"/dev/shm too small: {r.host} had {r.shm_free / MIB:.1f} MiB free, "
                         f"its {r.local_size} ranks' staging area needs {need / MIB:.1f} MiB "
                         f"(raise /dev/shm, or set DDL_SHM_ARENA_MB, see docs/containers.md)")
    for r in records:
        if r.probe_port <= 0:
            found.append(f"no probe port: rank {r.rank} on {r.host} could not open its probe "
                         f"port: when a collective waits long, the other ranks will take it "
                         f"for unreachable, as a dead rank (see docs/failures.md)")
    names = sorted({k for r in records for k in r.settings} - PER_RANK_SETTINGS)
    for name in names:
        values = {}
        for r in records:
            values.setdefault(r.settings.get(name, "(unset)"), []).append(r.host)
        if len(values) > 1:
            listed = "; ".join(f"{v} on {', '.join(sorted(set(h)))}"
                               for v, h in sorted(values.items()))
            found.append(f"different settings: {name} is {listed}")
    return found


def format_rows(columns, rows):
    """nccl-tests style lines: a header, then one right-aligned row per
    dict (floats with 3 decimals below 1000)."""
    def text(v):
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
        return str(v)
    widths = {c: max([len(c)] + [len(text(r[c])) for r in rows]) for c in columns}
    lines = ["# " + "  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  " + "  ".join(text(r[c]).rjust(widths[c]) for c in columns) for r in rows]
    return lines
