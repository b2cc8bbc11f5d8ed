"""The allreduce benchmark at tiny sizes: the table's structure and wrong == 0.
(Its real results live in docs/PERFORMANCE.md, not in assertions.)"""

import json
import subprocess
import sys

from conftest import launch_env, mpiexec_path


def test_allreduce_benchmark_tables(tmp_path):
    out = tmp_path / "bench.json"
    argv = [mpiexec_path(), "-n", "2", sys.executable, "-m", "keras_ddl.bench", "allreduce",
            "--sizes", "4096,65536,1048580", "--reps", "1", "--gradient-tensors", "12",
            "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=launch_env(),
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = "size  count  type  redop  time_us  algbw_GBps  busbw_GBps  baseline_us  speedup  wrong"
    assert " ".join(header.split()) in " ".join(proc.stdout.split())
    result = json.loads(out.read_text())
    assert result["ranks"] == 2
    rows = result["allreduce"]
    assert [r["count"] for r in rows] == [1024, 16384, 262145]
    for r in rows:
        assert r["wrong"] == 0 and r["time_us"] > 0 and r["baseline_us"] > 0
        assert abs(r["busbw_GBps"] - r["algbw_GBps"]) < 1e-9  # 2*(n-1)/n == 1 at n=2
        assert abs(r["speedup"] - r["baseline_us"] / r["time_us"]) < 1e-6
    grads = result["resnet50_gradients"]
    assert grads[0]["wrong"] == 0 and "12 tensors" in grads[0]["tensors"]
