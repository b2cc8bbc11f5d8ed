"""The SyncBN benchmark at a tiny size: both rows with positive times, the
overhead column computed from them, and every rank ending with the same
weights (for SyncBN its moving statistics too, which only the global
statistics make equal). Its real results live in docs/performance-notes/."""

import json


def test_syncbn_benchmark_table(launcher, tmp_path):
    out = tmp_path / "syncbn.json"
    proc = launcher.mpi(2, "-m", "keras_ddl.bench", "syncbn", "--reps", "1", "--steps", "3",
                        "--batch", "4", "--image-size", "16", "--json", str(out),
                        timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = ("variant ranks batch_per_rank steps reps step_ms min_ms max_ms overhead paired "
              "same_weights")
    assert header in " ".join(proc.stdout.split())
    result = json.loads(out.read_text())
    assert {"date", "commit", "command", "machine"} <= set(result["meta"])
    plain, sync = result["syncbn"]
    assert (plain["variant"], sync["variant"]) == ("plain_bn", "sync_bn")
    for row in (plain, sync):
        assert row["ranks"] == 2 and 0 < row["min_ms"] <= row["step_ms"] <= row["max_ms"]
        assert row["same_weights"] == "yes"
    assert abs(result["overhead"] - (sync["step_ms"] / plain["step_ms"] - 1)) < 1e-9
    assert sync["overhead"] == f"{100 * result['overhead']:+.1f}%"
    # one repetition: the paired ratio is the ratio of the two medians
    assert sync["paired"] == sync["overhead"]
