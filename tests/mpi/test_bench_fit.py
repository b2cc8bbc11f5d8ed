"""The fit benchmark's weak-scaling mode at a tiny size: three launches (1
rank, 2 ranks, 2 independent processes), the table's structure, and that
the 2-rank replicas stayed identical. Its real results live in
docs/PERFORMANCE.md, not in assertions."""

import json
import os
import sys


def test_fit_weak_scaling_table(launcher, tmp_path):
    out = tmp_path / "fit.json"
    argv = [sys.executable, "-m", "keras_ddl.bench", "fit", "--scaling", "2", "--rounds", "1",
            "--reps", "1", "--steps", "3", "--batch", "4", "--json", str(out)]
    # the driver finds mpiexec beside the interpreter or on PATH
    path = os.path.dirname(launcher.mpiexec()) + os.pathsep + os.environ.get("PATH", "")
    proc = launcher.command(argv, env={"PATH": path}, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    header = ("model ranks batch_per_rank steps reps cores 1rank_ms 2rank_ms efficiency "
              "1rank_min 2rank_min efficiency_min 1rank_cpu 2rank_cpu efficiency_cpu "
              "2x1_indep_ms machine communication img_per_s identical target")
    assert header in " ".join(proc.stdout.split())
    result = json.loads(out.read_text())
    assert {"date", "commit", "command", "machine"} <= set(result["meta"])
    row = result["scaling"]
    assert row["ranks"] == 2 and row["batch_per_rank"] == 4 and row["identical"] == "yes"
    assert abs(row["efficiency"] - row["1rank_ms"] / row["2rank_ms"]) < 1e-9
    # efficiency = machine x communication, by construction of the control
    assert abs(row["machine"] * row["communication"] - row["efficiency"]) < 1e-9
    # one sample per timed fit: 1 round x 1 repetition for each of the three launches
    assert {k: len(v) for k, v in result["step_s"].items()} == {"1": 1, "2": 1,
                                                                 "independent": 1}
