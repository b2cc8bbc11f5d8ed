"""Benchmark results as files: what a run records, and several launches merged into one file.

Standard library only (no TensorFlow, no MPI), so the docs test can use it.

Every ``python -m keras_ddl.bench ... --json PATH`` writes its payload with a
``meta`` entry from :func:`metadata`: UTC date, git commit, the command line,
the machine. A results file under ``docs/results/`` holds several launches of
one exact command and, for every table in them, the median and the range
(min-max) over the launches of each number::

    python -m keras_ddl_tools.results run --name allreduce_1host --launches 3 \\
        --conditions "quiet machine" -- \\
        mpiexec -n 2 python -m keras_ddl.bench allreduce --reps 7
    python -m keras_ddl_tools.results merge --name NAME --command "..." \\
        --conditions "..." -o docs/results/NAME.json one.json two.json ...

``run`` launches the command the given number of times, appending
``--json <temporary file>`` to it, and merges the launches into
``docs/results/NAME.json``. Tables in the docs are rendered from these files
by ``python -m keras_ddl_tools.render_docs``; figures are never typed by hand.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile

from .checkout import repository

REPO = repository()
RESULTS_DIR = os.path.join(REPO, "docs", "results")
FORMAT = 1
# Fields every results file must have (checked by tests/docs/test_docs.py).
REQUIRED = ("format", "name", "benchmark", "command", "conditions", "dates", "commits",
            "machine", "launches", "tables")
REQUIRED_META = ("date", "commit", "command", "machine")


def _git(where, *args):
    try:
        out = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit():
    """The checked-out commit, with "-dirty" when tracked files differ from it:
    of the repository this module is in, else of the current directory's
    (when keras_ddl_tools is an installed copy and the benchmark runs from a
    checkout)."""
    for where in (REPO, os.getcwd()):
        head = _git(where, "rev-parse", "HEAD")
        if head is not None:
            dirty = _git(where, "status", "--porcelain", "--untracked-files=no")
            return head + ("-dirty" if dirty else "")
    return "unknown"


def machine():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cores": os.cpu_count(), "cpu": model,
            "kernel": f"{platform.system()} {platform.release()}",
            "python": platform.python_version()}
    for module in ("tensorflow", "keras", "mpi4py"):
        if module in sys.modules:  # never imported just to be recorded
            info[module] = getattr(sys.modules[module], "__version__", "?")
    return info


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def metadata(argv=None):
    """What a benchmark launch records beside its figures."""
    argv = sys.argv if argv is None else argv
    command = argv
    if argv and argv[0].endswith("__main__.py"):  # python -m package
        package = os.path.basename(os.path.dirname(argv[0]))
        parent = os.path.basename(os.path.dirname(os.path.dirname(argv[0])))
        command = ["python", "-m", f"{parent}.{package}", *argv[1:]]
    meta = {"date": now(), "commit": commit(), "command": shlex.join(command),
            "machine": machine()}
    ranks = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
    if ranks:
        meta["launcher_ranks"] = int(ranks)
    return meta


def write_json(path, payload):
    """Writes payload with a ``meta`` entry (see metadata())."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"meta": metadata(), **payload}, f, indent=2)


# --- merging launches ----------------------------------------------------------------------

def _tables(payload):
    """name -> list of row dicts, for every table in one launch's payload."""
    tables = {}
    for key, value in payload.items():
        if key == "meta":
            continue
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            tables[key] = value
        elif isinstance(value, dict) and value and all(
                isinstance(v, (int, float, str)) for v in value.values()):
            tables[key] = [value]
    return tables


def _row_key(row):
    for field in ("size", "method", "model", "overlap", "layout", "tensors", "shape"):
        if isinstance(row.get(field), str):
            label = row[field]
            if field == "overlap" and "wire" in row:
                label += "/" + str(row["wire"])
            return label
    return "-"


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def merge(launches, name, command, conditions, benchmark=None):
    """One results file from several launches (payloads with ``meta``) of one command."""
    if not launches:
        raise ValueError("no launches to merge")
    per_table = {}
    for launch in launches:
        for table, rows in _tables(launch).items():
            for row in rows:
                key = _row_key(row)
                slot = per_table.setdefault(table, {}).setdefault(key, {})
                for field, value in row.items():
                    slot.setdefault(field, []).append(value)
    tables = {}
    for table, rows in per_table.items():
        out = []
        for key, fields in rows.items():
            merged = {"key": key, "launches": len(next(iter(fields.values())))}
            for field, values in fields.items():
                if all(_number(v) for v in values):
                    merged[field] = {"median": statistics.median(values), "min": min(values),
                                     "max": max(values), "values": values}
                elif len(set(map(str, values))) == 1:
                    merged[field] = values[0]
                else:
                    merged[field] = {"values": values}
            out.append(merged)
        tables[table] = out
    metas = [launch.get("meta", {}) for launch in launches]
    dates = sorted(m.get("date", "unknown") for m in metas)
    return {
        "format": FORMAT,
        "name": name,
        "benchmark": benchmark or command_benchmark(command),
        "command": command,
        "conditions": conditions,
        "dates": [dates[0], dates[-1]],
        "commits": sorted({m.get("commit", "unknown") for m in metas}),
        "machine": metas[0].get("machine", {}),
        "launches": launches,
        "tables": tables,
    }


def command_benchmark(command):
    words = shlex.split(command)
    if "keras_ddl.bench" in words:
        rest = words[words.index("keras_ddl.bench") + 1:]
        return rest[0] if rest else "bench"
    return os.path.basename(words[0]) if words else "unknown"


def save(result, path):
    """Writes beside `path` and renames over it: a save that fails part-way
    (a full disk, an interrupt) leaves the previous file as it was."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class ResultsFileError(ValueError):
    """A results or launch file that cannot be used; the message names it."""


# The largest results file in docs/results is a few hundred KB.
MAX_RESULTS_BYTES = 64 << 20


def read_json(path):
    """The JSON object in `path`, or ResultsFileError naming the file and
    what is wrong: unreadable, too large, not UTF-8, cut short or otherwise
    not JSON (with its line and column), or not an object."""
    try:
        with open(path, "rb") as f:
            # As many bytes as the file has (read(n) would allocate n first).
            data = f.read(min(os.fstat(f.fileno()).st_size, MAX_RESULTS_BYTES) + 1)
    except OSError as e:
        raise ResultsFileError(f"{path}: cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_RESULTS_BYTES:
        raise ResultsFileError(f"{path}: larger than {MAX_RESULTS_BYTES} bytes")
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ResultsFileError(f"{path}: byte {e.start} is not UTF-8 text") from None
    except RecursionError:
        raise ResultsFileError(f"{path}: nested too deeply to be a results file") from None
    except ValueError as e:  # json.JSONDecodeError: where it stopped
        raise ResultsFileError(f"{path}: not JSON (cut short or damaged?): {e}") from None
    if not isinstance(value, dict):
        raise ResultsFileError(f"{path}: holds a JSON {type(value).__name__}, not an object")
    return value


def read_results(path):
    """One results file, checked (see check): ResultsFileError naming the
    file and every problem otherwise."""
    result = read_json(path)
    problems = check(result)
    if problems:
        raise ResultsFileError(f"{path}: not a complete results file: {'; '.join(problems)}")
    return result


def load_all(directory=RESULTS_DIR):
    """name -> results dict for every docs/results/*.json (ResultsFileError
    for the first that does not read; see read_results)."""
    out = {}
    if not os.path.isdir(directory):
        return out
    for entry in sorted(os.listdir(directory)):
        if entry.endswith(".json"):
            out[entry[:-5]] = read_results(os.path.join(directory, entry))
    return out


def check(result):
    """Problems with one results file (an empty list when it is complete)."""
    if not isinstance(result, dict):
        return [f"a JSON {type(result).__name__}, not an object"]
    problems = [f"missing field '{f}'" for f in REQUIRED if f not in result]
    launches = result.get("launches", [])
    if not isinstance(launches, list):
        problems.append("'launches' is not a list")
        launches = []
    for i, launch in enumerate(launches):
        meta = launch.get("meta", {}) if isinstance(launch, dict) else None
        if not isinstance(meta, dict):
            problems.append(f"launch {i}: not an object with a 'meta' object")
            continue
        problems += [f"launch {i}: meta lacks '{f}'" for f in REQUIRED_META if f not in meta]
    if not isinstance(result.get("tables", {}), dict):
        problems.append("'tables' is not an object")
    if not launches:
        problems.append("no launches")
    if not str(result.get("conditions", "")).strip():
        problems.append("empty 'conditions'")
    return problems


# --- command line --------------------------------------------------------------------------

def _run(args):
    command = args.command
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit("results run: give the benchmark command after --")
    if "--json" in command:
        raise SystemExit("results run: leave --json out of the command; run adds it")
    launches = []
    with tempfile.TemporaryDirectory(prefix="ddl_results_") as tmp:
        for i in range(args.launches):
            path = os.path.join(tmp, f"launch{i}.json")
            print(f"# launch {i + 1}/{args.launches}: {shlex.join(command)}", flush=True)
            proc = subprocess.run([*command, "--json", path])
            if proc.returncode != 0:
                raise SystemExit(f"launch {i + 1} failed with exit code {proc.returncode}")
            launches.append(read_json(path))
    result = merge(launches, args.name, shlex.join(command), args.conditions)
    out = args.output or os.path.join(RESULTS_DIR, f"{args.name}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    save(result, out)
    print(f"# {len(launches)} launches merged into {out}; now: python -m "
          f"keras_ddl_tools.render_docs")


def _merge(args):
    launches = []
    for path in args.files:
        launches.append(read_json(path))
    result = merge(launches, args.name, args.command, args.conditions)
    out = args.output or os.path.join(RESULTS_DIR, f"{args.name}.json")
    save(result, out)
    print(f"# {len(launches)} launches merged into {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_ddl_tools.results",
        description="Launch a benchmark several times and keep its figures as one results "
                    "file (docs/results/NAME.json): medians and ranges over launches.")
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="launch COMMAND --launches times, merge the launches")
    run.add_argument("--name", required=True, help="results file name (docs/results/NAME.json)")
    run.add_argument("--launches", type=int, default=3, help="how many launches (default 3)")
    run.add_argument("--conditions", required=True,
                     help="what else ran on the machine, pinning, anything a reader needs")
    run.add_argument("-o", "--output", help="write here instead of docs/results/NAME.json")
    run.add_argument("command", nargs=argparse.REMAINDER,
                     help="-- then the benchmark command, without --json")
    mg = sub.add_parser("merge", help="merge JSON files written by --json into one results file")
    mg.add_argument("--name", required=True)
    mg.add_argument("--command", required=True, help="the exact command every launch ran")
    mg.add_argument("--conditions", required=True)
    mg.add_argument("-o", "--output")
    mg.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.action == "run":
            if args.launches < 1:
                parser.error("--launches must be >= 1")
            _run(args)
        else:
            _merge(args)
    except ResultsFileError as e:
        raise SystemExit(f"results {args.action}: {e}") from None


if __name__ == "__main__":
    main()
