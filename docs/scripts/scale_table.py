"""The table of docs/failures.md ("At 64 to 256 ranks"): builds
tests/core/scale_check.cc against this checkout's core and runs
`scale_check --table CALLS` RUNS times, then prints one markdown row per rank
count: the time per call (each run's median over its calls) and the silent
node's verdict (each run's median over the ranks, and the slowest rank), as
the median over the runs with their range.

    python docs/scripts/scale_table.py [--runs 3] [--calls 7]

Needs a C++ compiler (as tests/test_core.py does); run it alone on the
machine, the figures are times.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROW = re.compile(r"^table ranks=(\d+) shape=(\S+) calls=(\d+) call_ms\(median,min,max\)= (\S+) "
                 r"(\S+) (\S+) verdicts=(\d+) verdict_s\(median,min,max\)= (\S+) (\S+) (\S+)$")


def build(directory):
    """scale_check, compiled as tests/test_core.py compiles it."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    import test_core
    test_core._objects = test_core.CoreObjects(directory)
    exe = test_core.build("scale_check.cc", test_core.engine_sources(),
                          __import__("pathlib").Path(directory), name="scale_check")
    return str(exe)


def spread(values, unit, digits):
    values = sorted(values)
    fmt = f"{{:.{digits}f}}"
    return (f"{fmt.format(statistics.median(values))} {unit} "
            f"({fmt.format(values[0])}-{fmt.format(values[-1])})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calls", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        exe = build(directory)
        rows = {}
        for run in range(args.runs):
            out = subprocess.run([exe, "--table", str(args.calls)], capture_output=True,
                                 text=True, timeout=900, check=True).stdout
            for line in out.splitlines():
                m = ROW.match(line)
                if not m:
                    continue
                print(f"run {run + 1}: {line}", flush=True)
                ranks = int(m.group(1))
                row = rows.setdefault(ranks, {"shape": m.group(2), "call": [], "verdict": [],
                                              "slowest": [], "verdicts": []})
                row["call"].append(float(m.group(4)))
                row["verdict"].append(float(m.group(8)))
                row["slowest"].append(float(m.group(10)))
                row["verdicts"].append(int(m.group(7)))
    print()
    print("| ranks | racks x nodes x local | time per call | silent-node verdict: median rank "
          "| slowest rank | ranks that gave the verdict |")
    print("| --- | --- | --- | --- | --- | --- |")
    for ranks, row in sorted(rows.items()):
        print(f"| {ranks} | {row['shape'].replace('x', ' x ')} | {spread(row['call'], 'ms', 0)} | "
              f"{spread(row['verdict'], 's', 2)} | {spread(row['slowest'], 's', 2)} | "
              f"{min(row['verdicts'])}-{max(row['verdicts'])} of {ranks} |")


if __name__ == "__main__":
    main()
