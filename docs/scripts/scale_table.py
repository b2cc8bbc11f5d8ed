"""The table of docs/failures.md ("At 64 to 256 ranks"): builds
tests/core/scale_check.cc against this checkout's core and runs
`scale_check --table CALLS` RUNS times. Each run is one launch of a results
file (src/keras_ddl_tools/results.py): per rank count, the time per call (the
run's median over its calls) and the silent node's reports (the median rank
and the slowest rank). The runs are merged into docs/results/NAME.json, and
`python -m keras_ddl_tools.render_docs` renders the table from it.

    python docs/scripts/scale_table.py [--runs 3] [--calls 7] [--name scale_harness] \
        --conditions "nothing else running; ..."

Needs a C++ compiler (as tests/core/test_core.py does); run it alone on the
machine, the figures are times.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "src"))
from keras_ddl_tools import results  # noqa: E402
ROW = re.compile(r"^table ranks=(\d+) shape=(\S+) calls=(\d+) call_ms\(median,min,max\)= (\S+) "
                 r"(\S+) (\S+) verdicts=(\d+) verdict_s\(median,min,max\)= (\S+) (\S+) (\S+)$")


def build(directory):
    """scale_check, compiled as tests/core/test_core.py compiles it."""
    sys.path.insert(0, os.path.join(REPO, "tests", "core"))
    import test_core
    test_core._objects = test_core.CoreObjects(directory)
    exe = test_core.build("scale_check.cc", test_core.engine_sources(),
                          __import__("pathlib").Path(directory), name="scale_check")
    return str(exe)


def run_rows(exe, calls):
    """One run of `scale_check --table CALLS`: one row per rank count."""
    out = subprocess.run([exe, "--table", str(calls)], capture_output=True, text=True,
                         timeout=900, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            print(line, flush=True)
            rows.append({"shape": m.group(2), "ranks": int(m.group(1)), "calls": int(m.group(3)),
                         "call_ms": float(m.group(4)), "verdicts": int(m.group(7)),
                         "verdict_median_s": float(m.group(8)),
                         "verdict_slowest_s": float(m.group(10))})
    if not rows:
        raise SystemExit("scale_check --table printed no table rows:\n" + out)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calls", type=int, default=7)
    p.add_argument("--name", default="scale_harness",
                   help="results file name (docs/results/NAME.json)")
    p.add_argument("--conditions", required=True,
                   help="what else ran on the machine, anything a reader needs")
    p.add_argument("-o", "--output", help="write here instead of docs/results/NAME.json")
    args = p.parse_args()
    command = "python docs/scripts/scale_table.py " + shlex.join(
        ["--runs", str(args.runs), "--calls", str(args.calls)])
    launches = []
    with tempfile.TemporaryDirectory() as directory:
        exe = build(directory)
        for run in range(args.runs):
            print(f"# run {run + 1}/{args.runs}: scale_check --table {args.calls}", flush=True)
            meta = results.metadata(["tests/core/scale_check", "--table", str(args.calls)])
            launches.append({"meta": meta, "scale": run_rows(exe, args.calls)})
    merged = results.merge(launches, args.name, command, args.conditions, benchmark="scale_check")
    out = args.output or os.path.join(results.RESULTS_DIR, f"{args.name}.json")
    results.save(merged, out)
    print(f"# {len(launches)} runs merged into {out}; now: python -m keras_ddl_tools.render_docs")


if __name__ == "__main__":
    main()
