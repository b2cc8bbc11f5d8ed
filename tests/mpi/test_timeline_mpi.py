"""DDL_TIMELINE: rank 0 writes a Chrome trace with every phase of every
reduced tensor, loadable even after the job is killed."""

import json

import pytest

# With room in the node's result pool (the default) the owners write one
# shared result instead of every rank copying all slices out.
NODE_PHASES = ["NEGOTIATE", "ALLREDUCE", "SHM_COPY_IN", "INTRA_NODE_REDUCE_SCATTER",
               "CROSS_NODE_ALLREDUCE", "INTRA_NODE_WRITE_SHARED_RESULT"]
# Up to 32 KB on one node: the single pass (NodeAllreduce::RunSmall).
SMALL_NODE_PHASES = ["NEGOTIATE", "ALLREDUCE", "SHM_COPY_IN", "SHM_SMALL_REDUCE"]
# Small tensors go in one round of messages (algorithms/allreduce.cc).
FLAT_PHASES = ["NEGOTIATE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "DIRECT_EXCHANGE_ALLREDUCE",
               "MEMCPY_OUT_FUSION_BUFFER"]


@pytest.fixture(scope="module")
def timelines(launcher, tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline")
    proc = launcher.mpi(2, "timeline_job.py", str(out), timeout=240,
                        env={"DDL_STALL_TIMEOUT_S": "20"})
    assert proc.returncode != 0, "rank 0 was killed: the launch must fail"
    files = {}
    for name in ("auto", "flat", "killed"):
        with open(out / f"{name}.json") as f:
            files[name] = json.load(f)  # raises if the file is not valid JSON
    return files


def rows(events):
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    by_row = {}
    for e in events:
        if e.get("ph") == "X":
            by_row.setdefault(names[e["tid"]], []).append(e)
    return by_row


@pytest.mark.parametrize("run, phases", [("auto", SMALL_NODE_PHASES), ("flat", FLAT_PHASES)])
def test_every_reduced_tensor_has_every_phase(timelines, run, phases):
    by_row = rows(timelines[run])
    tensors = [f"{run}.single", f"{run}.group.0", f"{run}.group.1"]
    for tensor in tensors:
        seen = [e["name"] for e in by_row[tensor]]
        for phase in phases:
            assert seen.count(phase) == 3, f"{tensor}: {phase} x{seen.count(phase)} in {seen}"
        assert len(seen) == 3 * len(phases), (tensor, seen)
        for e in by_row[tensor]:
            assert e["dur"] >= 0 and e["ts"] >= 0
    assert [e["name"] for e in by_row[f"{run}.gather"]] == ["NEGOTIATE", "ALLGATHER"]
    assert [e["name"] for e in by_row[f"{run}.bcast"]] == ["NEGOTIATE", "BROADCAST"]
    sizes = {e["args"]["bytes"] for e in by_row[f"{run}.single"] if e["name"] == "ALLREDUCE"}
    assert sizes == {4000, 4004, 4008}


def test_node_path_follows_the_size(timelines):
    # 400 KB on one node: the general path's phases, not the single pass.
    seen = [e["name"] for e in rows(timelines["auto"])["auto.large"]]
    assert sorted(seen) == sorted(NODE_PHASES), seen


def test_flat_algorithm_follows_the_size(timelines):
    # 2 ranks: up to 64 KB per rank one direct exchange, above it the
    # pairwise reduce-scatter and ring all-gather.
    by_row = rows(timelines["flat"])
    for tensor, algorithm, other in (
            ("flat.single", "DIRECT_EXCHANGE_ALLREDUCE", "PAIRWISE_RING_ALLREDUCE"),
            ("flat.large", "PAIRWISE_RING_ALLREDUCE", "DIRECT_EXCHANGE_ALLREDUCE")):
        seen = [e["name"] for e in by_row[tensor]]
        assert algorithm in seen and other not in seen, (tensor, seen)


def test_markers_and_nested_phases(timelines):
    events = timelines["auto"]
    marks = [e["name"] for e in events if e.get("ph") == "i"]
    fit_marks = [m for m in marks if m.startswith("epoch")]
    assert marks[:3] == [f"auto step {s}" for s in range(3)]
    # ddl.callbacks.TimelineCallback in a 2-epoch, 3-step DDLStrategy fit
    assert fit_marks == [f"epoch {e}{suffix}" for e in range(2)
                         for suffix in ("", " step 0", " step 1", " step 2")]
    # each marked step holds the allreduce of that step's gradients
    stamps = [e["ts"] for e in events if e.get("ph") == "i" and " step " in e["name"]
              and e["name"].startswith("epoch")]
    reduces = [e["ts"] for e in events if e.get("ph") == "X" and e["name"] == "ALLREDUCE"]
    for begin, end in zip(stamps, stamps[1:]):
        assert any(begin <= t < end for t in reduces), (begin, end)
    for e in rows(events)["auto.single"]:
        if e["name"] == "ALLREDUCE":
            inner = [p for p in rows(events)["auto.single"]
                     if p["name"].startswith(("SHM", "INTRA", "CROSS")) and p["ts"] >= e["ts"]
                     and p["ts"] <= e["ts"] + e["dur"]]
            assert sum(p["dur"] for p in inner[:4]) <= e["dur"] + 4


@pytest.mark.parametrize("run", ["auto", "flat"])
def test_eager_calls_run_their_cycles_on_the_calling_thread(timelines, run):
    # An eager op's thread runs the engine's cycle itself when none is
    # running (the engine thread's idle rounds can take a few); an op in a
    # tf.function never does, as its thread must not block.
    by_row = rows(timelines[run])

    def on_caller(tensor):
        return [e.get("args", {}).get("cycle") == "caller" for e in by_row[tensor]
                if e["name"] == "NEGOTIATE"]

    eager = on_caller(f"{run}.eager")
    assert len(eager) == 10 and sum(eager) >= 5, eager
    in_graph = on_caller(f"{run}.in_graph")
    assert len(in_graph) == 3 and not any(in_graph), in_graph
    assert not any(on_caller(f"{run}.gather")) and not any(on_caller(f"{run}.bcast"))


def test_killed_job_leaves_a_loadable_timeline(timelines):
    by_row = rows(timelines["killed"])
    assert "killed.single" in by_row and "never.completes" not in by_row
