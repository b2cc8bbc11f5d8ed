"""The MPI benchmarks at tiny sizes: the tables' structure and wrong == 0.
(Their real results live in docs/results/, rendered into docs/PERFORMANCE.md, not in assertions.)"""

import json


def test_allreduce_benchmark_tables(launcher, tmp_path):
    out = tmp_path / "bench.json"
    proc = launcher.mpi(2, "-m", "keras_ddl.bench", "allreduce",
                        "--sizes", "4096,65536,1048580", "--reps", "1", "--gradient-tensors", "12",
                        "--json", str(out), "--plot", str(tmp_path / "busbw.png"),
                        timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = "size  count  type  redop  time_us  algbw_GBps  busbw_GBps  baseline_us  speedup  wrong"
    assert " ".join(header.split()) in " ".join(proc.stdout.split())
    result = json.loads(out.read_text())
    assert result["ranks"] == 2
    # what a results file needs (keras_ddl_tools.results): when, what, where
    assert {"date", "commit", "command", "machine"} <= set(result["meta"])
    assert "keras_ddl.bench allreduce" in result["meta"]["command"]
    rows = result["allreduce"]
    assert [r["count"] for r in rows] == [1024, 16384, 262145]
    for r in rows:
        assert r["wrong"] == 0 and r["time_us"] > 0 and r["baseline_us"] > 0
        assert abs(r["busbw_GBps"] - r["algbw_GBps"]) < 1e-9  # 2*(n-1)/n == 1 at n=2
        assert abs(r["speedup"] - r["baseline_us"] / r["time_us"]) < 1e-6
        assert len(r["time_us_runs"]) == len(r["baseline_us_runs"]) == 1
    grads = result["resnet50_gradients"]
    assert grads[0]["wrong"] == 0 and "12 tensors" in grads[0]["tensors"]
    assert (tmp_path / "busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_all_runs_mwms_allreduce_and_fit(launcher, tmp_path):
    # MWMS must create its strategy before any other TensorFlow op: `all`
    # runs it first, then the allreduce tables, then fit, in one launch.
    proc = launcher.mpi(2, "-m", "keras_ddl.bench", "all", "--quick", "--json",
                        str(tmp_path / "r"), timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = ("size count type redop ddl_us mwms_us ddl_busbw_GBps mwms_busbw_GBps speedup "
              "wrong")
    assert header in " ".join(proc.stdout.split())
    mwms = json.loads((tmp_path / "r.mwms.json").read_text())
    assert [r["count"] for r in mwms["mwms"]] == [1024, 262144]
    for r in mwms["mwms"] + mwms["resnet50_gradients"]:
        assert r["wrong"] == 0 and r["ddl_us"] > 0 and r["mwms_us"] > 0
        assert abs(r["speedup"] - r["mwms_us"] / r["ddl_us"]) < 1e-6
    assert "8 tensors" in mwms["resnet50_gradients"][0]["tensors"]
    reduced = json.loads((tmp_path / "r.allreduce.json").read_text())
    assert all(r["wrong"] == 0 for r in reduced["allreduce"])
    assert reduced["resnet50_gradients"][0]["wrong"] == 0  # the grouped row is checked
    fit = json.loads((tmp_path / "r.fit.json").read_text())
    assert fit["ranks"] == 2 and fit["identical"] and len(fit["step_s"]["ddl"]) == 1
    assert fit["fit"][0]["ranks"] == 2 and "date" in fit["meta"]
