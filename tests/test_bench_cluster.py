"""The cluster allreduce benchmark at tiny sizes: it builds its own
namespace cluster, launches on it, and its table holds the link bound, the
MPICH baseline and fp16 (real results: docs/PERFORMANCE.md)."""

import json
import subprocess
import sys

import pytest
from conftest import TESTS_DIR, launch_env

from keras_ddl.cluster import missing_requirements


def test_allreduce_cluster_table(tmp_path):
    reason = missing_requirements()
    if reason:
        pytest.skip(f"the network-namespace test cluster needs root, ip and tc: {reason}")
    out = tmp_path / "cluster.json"
    argv = [sys.executable, "-m", "keras_ddl.bench", "allreduce", "--cluster", "2x1", "--rate",
            "100mbit", "--sizes", "4096,1048576", "--reps", "1", "--algorithms", "auto",
            "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=launch_env(),
                          cwd=TESTS_DIR)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "allreduce across 2 nodes x 1 rank(s), links 100mbit" in proc.stdout
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["size"] for r in rows] == ["4KB", "1MB"]
    for r, nbytes in zip(rows, (4096, 1 << 20)):
        assert r["wrong"] == 0
        # 2 nodes: each sends S over its link; 100 Mbit/s is 12.5 MB/s
        assert abs(r["bound_us"] - nbytes / 12.5e6 * 1e6) < 1e-6, r
        assert r["auto_us"] > 0 and r["mpi_us"] > 0 and r["fp16_us"] > 0
    # 1 MB over a 100 Mbit/s link cannot beat the link by much (the token
    # bucket lets its first 256 KB through at once): the shaping is real.
    assert rows[1]["auto_us"] > 0.5 * rows[1]["bound_us"], rows[1]
    assert rows[1]["mpi_us"] > 0.5 * rows[1]["bound_us"], rows[1]
