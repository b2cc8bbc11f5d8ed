"""keras_ddl.bench.timeline_overlap on hand-made traces: steps found by
their marks or gaps, scalar metric reductions left out, and the hidden / exposed
communication of each step against values worked out by hand."""

import json

import numpy as np
import pytest

from keras_ddl_tools.bench import timeline_overlap


def _events():
    def span(tid, name, start, end, nbytes=None):
        e = {"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": round(start * 1e6),
             "dur": round((end - start) * 1e6), "args": {}}
        if nbytes is not None:
            e["args"]["bytes"] = nbytes
        return e

    def collective(tid, handed, start, end, nbytes=4096):
        return [span(tid, "NEGOTIATE", handed, start), span(tid, "ALLREDUCE", start, end, nbytes)]

    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": f"g{t}"}}
              for t in (1, 2, 3)]
    events += collective(1, 0.000, 0.010, 0.050)                 # step 1: warm-up, left out
    events += collective(1, 1.000, 1.010, 1.100)                 # step 2
    events += collective(2, 1.200, 1.200, 1.400)
    events += collective(3, 1.450, 1.450, 1.460, nbytes=8)      # a metric scalar: ignored
    events += collective(1, 2.000, 2.000, 2.150)                 # step 3: the second
    events += collective(2, 2.100, 2.180, 2.260)                 # starts 30 ms late
    events += collective(3, 2.250, 2.250, 2.260, nbytes=8)
    return events


@pytest.mark.parametrize("closed", [True, False])
def test_hidden_and_exposed_communication_per_step(tmp_path, closed):
    text = "[\n" + "\n,\n".join(json.dumps(e) for e in _events()) + ("\n]" if closed else "\n,")
    path = tmp_path / "trace.json"
    path.write_text(text)
    records = timeline_overlap.collectives(timeline_overlap.read_trace(path))
    groups = timeline_overlap.steps(records)
    assert [len(g) for g in groups] == [1, 2, 2]
    step2, step3 = (timeline_overlap.step_overlap(g) for g in groups[1:])
    # step 2: gradients at 1.0 and 1.2, allreduces 1.01-1.10 and 1.2-1.4
    assert step2 == pytest.approx({"window_ms": 200, "busy_ms": 290, "hidden_ms": 90,
                                   "exposed_ms": 200, "collectives": 2})
    # step 3: gradients at 2.0 and 2.1, allreduces 2.0-2.15 and 2.18-2.26
    assert step3 == pytest.approx({"window_ms": 100, "busy_ms": 230, "hidden_ms": 100,
                                   "exposed_ms": 160, "collectives": 2})
    row = timeline_overlap.summary(path)
    assert row["steps"] == 2
    assert row["window_ms"] == pytest.approx(150)
    assert row["busy_ms"] == pytest.approx(260)
    assert row["hidden_ms"] == pytest.approx(95)
    assert row["exposed_ms"] == pytest.approx(180)
    assert row["hidden_fraction"] == pytest.approx(95 / 260)


def test_step_marks_split_steps_the_gaps_would_merge(tmp_path):
    # A step's last allreduce runs into the next step's first hand-over (no
    # gap between them): TimelineCallback's marks still tell the steps apart.
    def span(tid, name, start, end):
        return {"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": round(start * 1e6),
                "dur": round((end - start) * 1e6), "args": {"bytes": 4096}}

    def mark(label, t):
        return {"name": label, "ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": round(t * 1e6)}

    events = [mark("epoch 0", 0.0), mark("epoch 0 step 0", 0.0),
              span(1, "NEGOTIATE", 0.50, 0.50), span(1, "ALLREDUCE", 0.50, 1.05),
              span(2, "NEGOTIATE", 0.60, 0.60), span(2, "ALLREDUCE", 0.60, 0.70),
              mark("epoch 0 step 1", 1.0),
              span(1, "NEGOTIATE", 1.06, 1.06), span(1, "ALLREDUCE", 1.06, 1.20),
              span(2, "NEGOTIATE", 1.10, 1.10), span(2, "ALLREDUCE", 1.20, 1.30)]
    records = timeline_overlap.collectives(events)
    assert len(timeline_overlap.steps(records)) == 1  # the gap rule sees one step
    marks = timeline_overlap.step_marks(events)
    assert marks == [0.0, 1.0]
    groups = timeline_overlap.steps_by_marks(records, marks)
    assert [[r[0] for r in g] for g in groups] == [[0.5, 0.6], [1.06, 1.1]]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(events))
    row = timeline_overlap.summary(path, skip_first=0)
    # step 0: backward 0.5-0.6, exposed 0.6-1.05; step 1: 1.06-1.1, exposed 1.1-1.3
    assert row["steps"] == 2
    assert row["window_ms"] == pytest.approx(np.median([100, 40]))
    assert row["exposed_ms"] == pytest.approx(np.median([450, 200]))
