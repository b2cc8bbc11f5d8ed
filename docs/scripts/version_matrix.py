"""Builds keras_ddl against several TensorFlow versions, each in a fresh venv,
and runs the multi-process smoke tests on 2 ranks in each.

    python docs/scripts/version_matrix.py                       # 2.16 to 2.21
    python docs/scripts/version_matrix.py --versions 2.16,2.21 --work /tmp/vm
    python docs/scripts/version_matrix.py --write docs/versions.md

Not part of the default test suite: every version downloads TensorFlow (about
600 MB) and builds the C++ core and ops against it. For each version it

1. makes a venv with this script's Python, and pip-installs
   ``tensorflow==V.*`` with mpi4py, the mpich wheel, numpy and pytest (Keras is
   whatever that TensorFlow's requirements resolve to);
2. copies the committed source tree (``git archive HEAD``, or --source DIR) and
   builds it in place (``setup.py build_ext --inplace``) with that venv;
3. runs, on 2 ranks under mpiexec, the case scripts of the collectives
   (tests/mpi/test_collectives_mpi.py), of model.fit with DistributedOptimizer and the
   callbacks (tests/mpi/test_keras_mpi.py) and of DDLStrategy (tests/mpi/test_strategy_mpi.py),
   plus the LARS optimizer's tests (tests/unit/test_lars.py, one process).

It prints one table row per version (installed TensorFlow, Keras, build,
tests passed / run) and, with --write FILE, replaces the table between the
``<!-- version-matrix -->`` markers of FILE, dated. A version that fails to
install or build gets its row too, with the reason.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_VERSIONS = "2.16,2.17,2.18,2.19,2.20,2.21"
# The smoke tests: 2-rank cases of these files, and the optimizer's own tests.
MPI_TEST_FILES = ("tests/mpi/test_collectives_mpi.py", "tests/mpi/test_keras_mpi.py",
                  "tests/mpi/test_strategy_mpi.py")
SINGLE_TEST_FILES = ("tests/unit/test_lars.py",)
PACKAGES = ("mpi4py>=4.0", "mpich", "numpy", "pytest")
MARK_BEGIN, MARK_END = "<!-- version-matrix -->", "<!-- /version-matrix -->"


def run(argv, log, cwd=None, env=None, timeout=None):
    """Runs argv, appending its output to the file ``log``; returns the exit code."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        try:
            return subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout} s\n")
            return 124


def installed_version(python, module):
    proc = subprocess.run([python, "-c", f"import importlib.metadata as m; "
                           f"print(m.version({module!r}))"], capture_output=True, text=True)
    return proc.stdout.strip() or "?"


def smoke_test_ids(python, source, env):
    """The pytest node ids: every 2-rank case of MPI_TEST_FILES, and SINGLE_TEST_FILES."""
    proc = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", *MPI_TEST_FILES],
                          cwd=source, env=env, capture_output=True, text=True, timeout=600)
    ids = [line for line in proc.stdout.splitlines()
           if "::" in line and re.search(r"[\[-]2\]$", line)]
    return ids + list(SINGLE_TEST_FILES)


def junit_counts(path):
    """(passed, failed, errors, skipped, names of the tests that did not
    pass) from a pytest junit XML file."""
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = failed = errors = skipped = 0
    names = []
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0))
        errors += int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
        for case in suite.iter("testcase"):
            if any(child.tag in ("failure", "error", "skipped") for child in case):
                names.append(f"{case.get('classname', '').rsplit('.', 1)[-1]}::"
                             f"{case.get('name', '')}")
    return total - failed - errors - skipped, failed, errors, skipped, names


def one_version(version, work, source_dir, timeout):
    """Installs, builds and tests one TensorFlow version; returns a result dict."""
    result = {"requested": version, "tensorflow": "-", "keras": "-", "build": "-",
              "tests": "-", "note": ""}
    root = os.path.join(work, f"tf{version}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    log = os.path.join(root, "log.txt")
    result["log"] = log
    venv = os.path.join(root, "venv")
    python = os.path.join(venv, "bin", "python")
    if run([sys.executable, "-m", "venv", venv], log) != 0:
        result["note"] = "venv creation failed"
        return result
    if run([python, "-m", "pip", "install", "-q", f"tensorflow=={version}.*", *PACKAGES],
           log, timeout=timeout) != 0:
        result["note"] = f"pip install failed (its log: tf{version}/log.txt under --work)"
        return result
    result["tensorflow"] = installed_version(python, "tensorflow")
    result["keras"] = installed_version(python, "keras")
    source = os.path.join(root, "src")
    if source_dir:
        shutil.copytree(source_dir, source, ignore=shutil.ignore_patterns(
            ".git", "build", "*.so", "*.o", "build_info.json", "__pycache__"))
    else:
        os.makedirs(source)
        archive = subprocess.run(["git", "-C", REPO, "archive", "HEAD"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", source], input=archive, check=True)
    env = dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"],
               PYTHONPATH=source, VIRTUAL_ENV=venv)
    if run([python, "setup.py", "-q", "build_ext", "--inplace"], log, cwd=source, env=env,
           timeout=timeout) != 0:
        result["build"] = "failed"
        result["note"] = f"build failed (its log: tf{version}/log.txt under --work)"
        return result
    result["build"] = "ok"
    ids = smoke_test_ids(python, source, env)
    junit = os.path.join(root, "junit.xml")
    code = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                *ids], log, cwd=source, env=env, timeout=timeout)
    if not os.path.exists(junit):
        result["note"] = f"pytest did not report (exit {code}; its log: tf{version}/log.txt under --work)"
        return result
    passed, failed, errors, skipped, names = junit_counts(junit)
    run_count = passed + failed + errors + skipped
    result["tests"] = f"{passed} / {run_count}"
    if failed or errors or skipped:
        # The tests by name: the table is published, the log stays local.
        result["note"] = (f"{failed} failed, {errors} errors, {skipped} skipped: "
                          + ", ".join(f"`{n}`" for n in names))
    return result


def table(results, date):
    lines = [f"Run {date} on {platform.system()} {platform.machine()}, Python "
             f"{platform.python_version()}, 2 ranks under the mpich wheel's mpiexec "
             "(`docs/scripts/version_matrix.py`).", "",
             "| TensorFlow | Keras | build | smoke tests passed / run | note |",
             "|---|---|---|---|---|"]
    for r in results:
        tf_version = r["tensorflow"] if r["tensorflow"] != "-" else f"{r['requested']} (requested)"
        lines.append(f"| {tf_version} | {r['keras']} | {r['build']} | {r['tests']} | "
                     f"{r['note']} |")
    return "\n".join(lines)


def write_table(path, text):
    with open(path) as f:
        content = f.read()
    if MARK_BEGIN not in content or MARK_END not in content:
        raise SystemExit(f"--write {path}: no {MARK_BEGIN} ... {MARK_END} markers in it")
    head, rest = content.split(MARK_BEGIN, 1)
    _, tail = rest.split(MARK_END, 1)
    with open(path, "w") as f:
        f.write(f"{head}{MARK_BEGIN}\n{text}\n{MARK_END}{tail}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--versions", default=DEFAULT_VERSIONS,
                   help=f"comma-separated TensorFlow minor versions (default {DEFAULT_VERSIONS})")
    p.add_argument("--work", default="/tmp/keras_ddl_version_matrix",
                   help="directory for the venvs, source copies and logs (each version's "
                   "directory is replaced)")
    p.add_argument("--source", help="test this source tree (copied, without build outputs) "
                   "instead of the repository's committed HEAD")
    p.add_argument("--timeout", type=int, default=3600,
                   help="seconds allowed for each install, build and test run")
    p.add_argument("--write", metavar="FILE",
                   help="replace the table between the version-matrix markers of FILE")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    bad = [v for v in versions if not re.fullmatch(r"\d+\.\d+", v)]
    if bad or not versions:
        p.error(f"--versions: expected minor versions like 2.16,2.21, got {args.versions!r}")
    if args.source and not os.path.isdir(args.source):
        p.error(f"--source {args.source}: not a directory")
    os.makedirs(args.work, exist_ok=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = []
    for version in versions:
        print(f"TensorFlow {version}: installing, building, testing ...", flush=True)
        results.append(one_version(version, args.work, args.source, args.timeout))
        print(table(results[-1:], date).splitlines()[-1], flush=True)
        print(f"  log: {results[-1]['log']}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"date": date, "results": results}, f, indent=1)
        if args.write:  # after every version, so a stopped run keeps what it finished
            write_table(args.write, table(results, date))
    print()
    print(table(results, date))
    return 0 if all(r["tests"] != "-" and not r["note"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
