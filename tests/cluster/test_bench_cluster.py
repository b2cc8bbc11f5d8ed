"""The cluster allreduce benchmark at tiny sizes: it builds its own
namespace cluster, launches on it, and its table holds the link bound, the
MPICH baseline and fp16 (real results: docs/PERFORMANCE.md)."""

import json
import sys

import pytest


@pytest.mark.usefixtures("needs_netns")
def test_allreduce_cluster_table(launcher, tmp_path):
    out = tmp_path / "cluster.json"
    argv = [sys.executable, "-m", "keras_ddl.bench", "allreduce", "--cluster", "2x1", "--rate",
            "100mbit", "--burst", "16k", "--sizes", "4096,1048576", "--reps", "1",
            "--algorithms", "auto", "--json", str(out)]
    proc = launcher.command(argv, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert ("allreduce across 2 nodes x 1 rank(s), links 100mbit each way with a 16KB token "
            "bucket") in proc.stdout
    result = json.loads(out.read_text())
    assert result["burst_bytes"] == 16384
    rows = result["rows"]
    assert [r["size"] for r in rows] == ["4KB", "1MB"]
    for r, nbytes in zip(rows, (4096, 1 << 20)):
        assert r["wrong"] == 0
        # 2 nodes: each sends S over its link; 100 Mbit/s is 12.5 MB/s
        assert abs(r["bound_us"] - nbytes / 12.5e6 * 1e6) < 1e-6, r
        assert r["auto_us"] > 0 and r["mpi_us"] > 0 and r["fp16_us"] > 0
    # 1 MB over a 100 Mbit/s link cannot beat the link: a 16 KB bucket lets
    # only its first 16 KB through at once, so the shaping is real.
    assert rows[1]["auto_us"] > 0.95 * rows[1]["bound_us"], rows[1]
    assert rows[1]["mpi_us"] > 0.95 * rows[1]["bound_us"], rows[1]


@pytest.mark.usefixtures("needs_netns")
def test_fit_cluster_tables_and_timeline(launcher, tmp_path):
    out = tmp_path / "fit.json"
    argv = [sys.executable, "-m", "keras_ddl.bench", "fit", "--cluster", "2", "--rate", "1gbit",
            "--model", "cnn", "--batch", "16", "--steps", "4", "--reps", "1", "--rounds", "1",
            "--json", str(out)]
    proc = launcher.command(argv, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    layouts = [(r["overlap"], r["wire"]) for r in result["rows"]]
    assert layouts == [("off", "fp32"), ("on", "fp32"), ("off", "fp16"), ("on", "fp16")]
    for r in result["rows"]:
        # efficiency is the ratio of the two step-time columns. Three timed
        # steps of a tiny CNN swing by half on a shared 2-core machine (one
        # CI run saw 1 rank at 52 ms, 2 nodes at 32 ms), so the bound only
        # catches a broken measurement: a 2-node step more than twice as fast
        # as the same step alone did not do the step.
        assert r["identical"] == "yes", r
        assert abs(r["efficiency"] - r["1rank_ms"] / r["2x1_ms"]) < 1e-9, r
        assert 0 < r["efficiency"] < 2.0, r
        # the control run split it: machine x communication
        assert r["2x1_indep_ms"] > 0, r
        assert abs(r["machine"] * r["communication"] - r["efficiency"]) < 1e-9, r
    # Rank 0's trace of every layout, read step by step at TimelineCallback's
    # marks (4 steps a fit, the first left out, a warm-up fit and a timed
    # one): allreduce time inside the window cannot exceed the step's.
    assert [(t["overlap"], t["wire"]) for t in result["timeline"]] == layouts
    for t in result["timeline"]:
        assert t["steps"] == 7 and t["collectives"] >= 1, t
        assert 0 <= t["hidden_ms"] <= t["busy_ms"] + 1e-6, t
        assert t["window_ms"] >= 0 and t["exposed_ms"] >= 0, t
        assert (tmp_path / f"fit.{t['overlap']}.{'none' if t['wire'] == 'fp32' else t['wire']}"
                           ".trace.json").exists()
    assert "where the allreduces ran" in proc.stdout


def test_gradient_table_takes_each_ratio_within_its_launch():
    from keras_ddl_tools.bench.cluster import _gradient_table

    def launch(ddl_us, mpi_us, wrong):
        return [{"method": "grouped", "tensors": "2 tensors, 1.0 MB", "time_us": ddl_us,
                 "vs_separate": mpi_us / ddl_us, "wrong": wrong},
                {"method": "mpi per tensor", "tensors": "2 tensors, 1.0 MB", "time_us": mpi_us,
                 "vs_separate": 1.0, "wrong": "-"}]

    # A slow launch (both 10x slower) must not change the ratio: 2x, 4x, 3x.
    table = _gradient_table([launch(10, 20, 0), launch(100, 400, 1), launch(20, 60, 0)], "auto")
    assert [r["method"] for r in table] == ["grouped", "mpi per tensor"]
    assert table[0]["time_us"] == 20 and table[0]["vs_mpi"] == 3.0
    assert table[0]["wrong"] == 1 and table[0]["algorithm"] == "auto"
    assert table[1]["vs_mpi"] == 1.0 and table[1]["wrong"] == "-"
    assert _gradient_table([], "auto") == []
