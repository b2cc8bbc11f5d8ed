"""Where a training step's allreduces ran, read from a `DDL_TIMELINE` trace.

Each collective's trace has a ``NEGOTIATE`` span from the moment its tensor
was handed to keras_ddl (a gradient: the moment backprop produced it) to the
moment it started, then the collective's own span (``ALLREDUCE``). Within a
step, the last tensor handed over is the last gradient, so

- ``window_ms``: first to last hand-over of the step. It spans the backward
  pass and, when the model has them, the forward pass's collectives too
  (under DDLStrategy a BatchNormalization moving statistic is averaged
  across ranks when it is updated);
- ``hidden_ms``: time within that window in which some allreduce ran;
- ``exposed_ms``: last hand-over to the end of the last allreduce, the
  communication the step waits for after its backward pass.

Only allreduces of at least ``min_bytes`` count (default 256, a 64-float
gradient): the metrics' scalar reductions come after the optimizer step and
would otherwise pass for the last gradient. Steps are the intervals between
the ``epoch E step S`` marks ``keras_ddl.callbacks.TimelineCallback`` puts
in the trace (a collective belongs to the step in which it was handed
over); a trace without marks is split where nothing was handed over or
running for ``gap_s``.
"""

import bisect
import json
import statistics

# The executor names every allreduce span so, grouped calls included
# (engine/executor.cc).
ALLREDUCE_SPAN = "ALLREDUCE"


def read_trace(path):
    with open(path) as f:
        text = f.read().rstrip().rstrip(",")
    if not text.endswith("]"):  # a trace whose process ended without closing it
        text += "]"
    return json.loads(text)


def collectives(events, min_bytes=256):
    """[(handed_over_s, start_s, end_s)] per collective of at least
    ``min_bytes``, by hand-over time."""
    handed, spans = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("tid"))
        if e["name"] == "NEGOTIATE":
            handed.setdefault(key, []).append(e["ts"] / 1e6)
        elif e["name"] == ALLREDUCE_SPAN:
            nbytes = e.get("args", {}).get("bytes", 0)
            spans.setdefault(key, []).append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, nbytes))
    out = []
    for key, starts in handed.items():
        for t, (s, end, nbytes) in zip(sorted(starts), sorted(spans.get(key, []))):
            if nbytes >= min_bytes:
                out.append((t, s, end))
    return sorted(out)


def step_marks(events):
    """Start times (s) of the steps marked in the trace, in order."""
    return sorted(e["ts"] / 1e6 for e in events
                  if e.get("ph") == "i" and " step " in e.get("name", ""))


def steps_by_marks(records, marks):
    groups = [[] for _ in marks]
    for rec in records:
        k = bisect.bisect_right(marks, rec[0]) - 1
        if k >= 0:
            groups[k].append(rec)
    return [g for g in groups if g]


def steps(records, gap_s=0.15):
    groups, last_end = [], None
    for rec in records:
        if last_end is None or rec[0] > last_end + gap_s:
            groups.append([])
            last_end = rec[2]
        groups[-1].append(rec)
        last_end = max(last_end, rec[2])
    return groups


def _union_within(intervals, lo, hi):
    total, reach = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, reach), min(e, hi)
        if e > s:
            total += e - s
            reach = e
    return total


def step_overlap(group):
    first = min(r[0] for r in group)
    last = max(r[0] for r in group)
    end = max(r[2] for r in group)
    spans = [(r[1], r[2]) for r in group]
    return {"window_ms": (last - first) * 1e3,
            "busy_ms": _union_within(spans, first, end) * 1e3,
            "hidden_ms": _union_within(spans, first, last) * 1e3,
            "exposed_ms": (end - last) * 1e3,
            "collectives": len(group)}


def summary(path, skip_first=1, gap_s=0.15, min_bytes=256):
    """Medians over the trace's steps (the first ``skip_first`` left out:
    tracing and warm-up)."""
    events = read_trace(path)
    records = collectives(events, min_bytes)
    marks = step_marks(events)
    groups = steps_by_marks(records, marks) if marks else steps(records, gap_s)
    per_step = [step_overlap(g) for g in groups]
    kept = per_step[skip_first:] or per_step
    row = {k: statistics.median(s[k] for s in kept) for k in kept[0]}
    row["steps"] = len(kept)
    busy = row["busy_ms"]
    row["hidden_fraction"] = row["hidden_ms"] / busy if busy else 0.0
    return row
