"""Runs Horovod's own TensorFlow 2 examples through keras_ddl's Horovod front
door, with only the edits docs/horovod_porting.md lists, on N ranks.

    python docs/scripts/horovod_tf2_examples.py --examples DIR [--np 2]

DIR holds copies of Horovod's examples/tensorflow2/ files
tensorflow2_synthetic_benchmark.py (a custom training loop with
DistributedGradientTape) and tensorflow2_keras_synthetic_benchmark.py
(model.fit with DistributedOptimizer), downloaded by you from the Horovod
repository (they are not part of keras_ddl). For each, the script

1. reads the edit table between the ``<!-- horovod-tf2-edits -->`` markers of
   docs/horovod_porting.md (Horovod's text -> keras_ddl's) and applies every
   edit whose Horovod text the file contains, to a copy in --work (the
   originals are not changed);
2. refuses the copy if a Horovod import is left (the guide would be missing
   an edit);
3. runs it under the environment's mpiexec on --np ranks with a small model
   and few steps on the CPU, without and with --fp16-allreduce, and checks
   that it exits 0 and rank 0 prints its throughput line.

It prints one row per run (example, compression, edits applied, result,
seconds) and exits non-zero if a run failed. Not part of the test suite:
each run imports TensorFlow on every rank and builds a Keras application
model.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(REPO, "docs", "horovod_porting.md")
MARK_BEGIN, MARK_END = "<!-- horovod-tf2-edits -->", "<!-- /horovod-tf2-edits -->"
# The example, and its arguments for a short CPU run (Horovod's own flags).
EXAMPLES = {
    "tensorflow2_synthetic_benchmark.py": [
        "--model", "MobileNetV3Small", "--batch-size", "4", "--num-warmup-batches", "1",
        "--num-batches-per-iter", "2", "--num-iters", "2", "--no-cuda"],
    "tensorflow2_keras_synthetic_benchmark.py": [
        "--model", "MobileNetV3Small", "--batch-size", "4", "--num-batches-per-iter", "2",
        "--num-iters", "2", "--no-cuda"],
}
THROUGHPUT = re.compile(r"Total img/sec on \d+ CPU\(s\)")


def guide_edits(path=GUIDE):
    """[(Horovod's text, keras_ddl's text)] from the guide's edit table:
    rows of two code spans between the markers."""
    with open(path) as f:
        text = f.read()
    if MARK_BEGIN not in text or MARK_END not in text:
        raise SystemExit(f"{path}: no {MARK_BEGIN} ... {MARK_END} table")
    table = text.split(MARK_BEGIN, 1)[1].split(MARK_END, 1)[0]
    edits = []
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[1].startswith("`"):
            edits.append((cells[0].strip("`"), cells[1].strip("`")))
    if not edits:
        raise SystemExit(f"{path}: the edit table between the markers has no rows")
    return edits


def port(source, target, edits):
    """Copies `source` to `target` with the edits applied; returns the
    edits that applied."""
    with open(source) as f:
        text = f.read()
    applied = []
    for old, new in edits:
        if old in text:
            text = text.replace(old, new)
            applied.append(old)
    left = [line.strip() for line in text.splitlines()
            if re.match(r"\s*(import|from)\s+horovod\b", line)]
    if left:
        raise SystemExit(f"{source}: a Horovod import is left after the guide's edits: {left}")
    with open(target, "w") as f:
        f.write(text)
    return applied


def mpiexec():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec") or "mpiexec"


def run(script, args, ranks, timeout):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    try:
        proc = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, script, *args],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    ok = proc.returncode == 0 and THROUGHPUT.search(proc.stdout) is not None
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    return ok, ("; ".join(l for l in tail if THROUGHPUT.search(l)) if ok
                else f"exit {proc.returncode}: " + " | ".join(tail[-6:])), seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", required=True,
                   help="directory with Horovod's two TensorFlow 2 synthetic benchmarks")
    p.add_argument("--np", type=int, default=2, help="ranks per run (default 2)")
    p.add_argument("--work", default="horovod_tf2_ported",
                   help="directory for the ported copies (default ./horovod_tf2_ported)")
    p.add_argument("--timeout", type=int, default=900, help="seconds allowed per run")
    args = p.parse_args(argv)
    edits = guide_edits()
    os.makedirs(args.work, exist_ok=True)
    rows, failed = [], False
    for name, flags in EXAMPLES.items():
        source = os.path.join(args.examples, name)
        if not os.path.exists(source):
            p.error(f"--examples {args.examples}: no {name} there")
        target = os.path.join(args.work, name)
        applied = port(source, target, edits)
        for fp16 in (False, True):
            ok, detail, seconds = run(target, flags + (["--fp16-allreduce"] if fp16 else []),
                                      args.np, args.timeout)
            failed = failed or not ok
            rows.append((name, "fp16" if fp16 else "none", len(applied),
                         "ok" if ok else "FAILED", f"{seconds:.0f}", detail))
            print(f"{name} compression={rows[-1][1]}: {rows[-1][3]} ({detail})", flush=True)
    print(f"\n{args.np} ranks; edits from {os.path.relpath(GUIDE, REPO)}\n")
    print("| example | compression | edits applied | result | seconds |")
    print("|---|---|---|---|---|")
    for name, compression, count, result, seconds, _ in rows:
        print(f"| `{name}` | {compression} | {count} | {result} | {seconds} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
