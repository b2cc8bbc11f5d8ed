"""The seeded mutation driver of the Python decoders of files (the C++
decoders' driver is driver.cc beside this file): a hostfile (ddlrun's
--hostfile), a results file (docs/results/*.json) and a backup of
BackupAndRestore (its meta.json, variables.bin and rank files).

Each target writes the input to a file and reads it as the software does;
the input is either accepted or refused with the target's own error,
whose message names the file. Anything else is a finding: another
exception, an input that takes more than a second, or one that makes the
reader allocate more than 64 MiB (no input here justifies that; traced by
tracemalloc, which numpy reports to). A finding prints FUZZ FINDING and
the input's path, kept in --findings.

    python tests/core/fuzz/files.py [--seconds 2] [--seed N] [--target NAME ...]
    python tests/core/fuzz/files.py --seconds 600 --target backup   # 10 minutes

Every file of tests/core/fuzz_corpus/<target>/ runs first as it is (the
seeds and the regression cases; "<target>/<file>: decoded" or
"...: refused: <message>"), then mutants of the corpus: byte flips, edge
numbers, cuts, splices, and for JSON a value replaced by one of another
type or range. --write-seeds writes the seeds (seed-N) and exits. The
last line is "<N> checks, 0 failures".

The decoders are the source tree's (src/ first on sys.path; backup_store
loaded from its file, which needs numpy only: importing keras_ddl would
load TensorFlow, seconds per run).
"""

import argparse
import datetime
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CORPUS = os.path.join(os.path.dirname(HERE), "fuzz_corpus")
sys.path.insert(0, os.path.join(REPO, "src"))

from keras_ddl_launcher import hosts  # noqa: E402
from keras_ddl_tools import results  # noqa: E402


def _load_backup_store():
    path = os.path.join(REPO, "src", "keras_ddl", "keras", "backup_store.py")
    spec = importlib.util.spec_from_file_location("ddl_fuzz_backup_store", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


backup_store = _load_backup_store()
import numpy as np  # noqa: E402

MAX_TRACED_BYTES = 64 << 20
MAX_SECONDS = 1.0


class Finding(Exception):
    pass


# --- targets: each takes bytes and a scratch folder, returns "" (accepted) or the refusal

def hostfile(data, scratch):
    path = os.path.join(scratch, "hostfile")
    with open(path, "wb") as f:
        f.write(data)
    try:
        items, racks = hosts.split_racks(
            hosts.hostfile_items(hosts.read_hostfile(path), path), path)
        listed = hosts.parse_hosts(items, path)
    except hosts.UsageError as e:
        if path not in str(e):
            raise Finding(f"a refusal that does not name the file: {e}") from None
        return str(e)
    for name, slots in listed:
        if not hosts.HOST_NAME_PATTERN.match(name) or slots < 1:
            raise Finding(f"accepted host {name!r} with {slots} slots")
    if len({h for h, _ in listed}) != len(listed) or (racks and set(racks) != {h for h, _ in listed}):
        raise Finding("accepted a host twice, or racks for some hosts only")
    return ""


def hostfile_seeds():
    return [b"node1:1@rackA\nnode2:4@rackA\n# a comment\n\nnode3:2@rackB\n",
            b"node1 slots=4 max_slots=8\nnode2 slots=2  # Open MPI\r\n",
            b"job-worker-0.job.ns.svc slots=8 rack=r1\njob-worker-1.job.ns.svc slots=8 rack=r2\n",
            b"node-a\nnode-b:3 # two hosts, MPICH's form\n"]


def results_file(data, scratch):
    path = os.path.join(scratch, "results.json")
    with open(path, "wb") as f:
        f.write(data)
    try:
        result = results.read_results(path)
    except results.ResultsFileError as e:
        if path not in str(e):
            raise Finding(f"a refusal that does not name the file: {e}") from None
        return str(e)
    if results.check(result):
        raise Finding(f"accepted, with problems: {results.check(result)}")
    return ""


def results_seeds():
    launch = {"meta": {"date": "2026-12-07T04:00:00", "commit": "abc1234", "command": "x",
                       "machine": {"cpus": 2}}, "rows": [{"size": "4 MB", "seconds": 0.25}]}
    merged = results.merge([launch, launch], "demo", "python -m keras_ddl.bench x", "idle")
    return [json.dumps(merged, indent=1).encode() + b"\n",
            json.dumps(merged, separators=(",", ":")).encode()]


BACKUP_FILES = [backup_store.META, backup_store.VARIABLES, backup_store.rank_file(0),
                backup_store.rank_file(1)]


def _backup(scratch):
    """A backup as BackupAndRestore writes one: 3 variables, 2 ranks."""
    folder = os.path.join(scratch, "backups")
    arrays = [("dense/kernel", np.arange(12, dtype=np.float32).reshape(3, 4)),
              ("dense/bias", np.array([1, -2, 3], np.int64)),
              ("optimizer/iterations", np.array(7, np.int64)),
              ("mask", np.array([True, False]))]
    blobs = {r: backup_store.npz_bytes({"own_0": np.full([2], r, np.float32)}) for r in (0, 1)}
    meta = {"position": {"epoch": 2, "step": 5, "global_batch": 64, "iterations": 21,
                         "world_size": 2, "shuffle_seed": 99, "input": "arrays"},
            "root_rank": 0, "iterator_epoch": None}
    return backup_store.write_backup(folder, backup_store.backup_name(2, 5), meta, arrays, blobs)


_BACKUP = {}


def backup(data, scratch):
    """The first byte picks the file of the backup the rest replaces."""
    if not data:
        return ""
    if scratch not in _BACKUP:
        path = _backup(scratch)
        _BACKUP[scratch] = (path, {n: open(os.path.join(path, n), "rb").read()
                                   for n in BACKUP_FILES})
    path, originals = _BACKUP[scratch]
    chosen = BACKUP_FILES[data[0] % len(BACKUP_FILES)]
    for name, content in originals.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data[1:] if name == chosen else content)
    try:
        meta = backup_store.read_meta(path)
        backup_store.verify(path, meta)
        for _, dtype, shape, raw in backup_store.read_variables(path, meta):
            raw.view(np.dtype(dtype)).reshape(shape)
        for name in meta["files"]:
            if name != backup_store.VARIABLES:
                with open(os.path.join(path, name), "rb") as f:
                    backup_store.read_npz_bytes(f.read())
    except backup_store.BackupError as e:
        if path not in str(e):
            raise Finding(f"a refusal that does not name the file: {e}") from None
        return str(e)
    if chosen != backup_store.META and data[1:] != originals[chosen]:
        raise Finding(f"{chosen} changed, and the backup still verified")
    return ""


def backup_seeds():
    with tempfile.TemporaryDirectory() as scratch:
        path = _backup(scratch)
        return [bytes([i]) + open(os.path.join(path, n), "rb").read()
                for i, n in enumerate(BACKUP_FILES)]


TARGETS = {"hostfile": (hostfile, hostfile_seeds), "results_file": (results_file, results_seeds),
           "backup": (backup, backup_seeds)}


# --- mutations

EDGES = [0, 1, -1, 2, 7, 63, 64, 255, 256, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32,
         2 ** 63, 10 ** 30, -(2 ** 63), 0.5, float("nan"), float("inf")]


def _json_mutant(value, rng):
    """`value` with one of its parts replaced, removed or given a sibling."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value))
        roll = rng.random()
        if roll < 0.15:
            return {k: v for k, v in value.items() if k != key}
        if roll < 0.25:
            return dict(value, **{key + "_x": _random_value(rng)})
        return dict(value, **{key: _json_mutant(value[key], rng)})
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        roll = rng.random()
        if roll < 0.15:
            return value[:i] + value[i + 1:]
        if roll < 0.25:
            return value + [value[i]]
        return value[:i] + [_json_mutant(value[i], rng)] + value[i + 1:]
    return _random_value(rng)


def _random_value(rng):
    roll = rng.randrange(8)
    if roll == 0:
        return rng.choice(EDGES)
    if roll == 1:
        return rng.choice([None, True, False, "", "../../etc/passwd", "float32", "object",
                           "bfloat16", "rank-00000.npz", "variables.bin", "x" * 300])
    if roll == 2:
        return [rng.choice(EDGES) for _ in range(rng.randrange(4))]
    if roll == 3:
        return {"a": rng.choice(EDGES)}
    if roll == 4:
        return [[[]]] * rng.randrange(3)
    return rng.randrange(-5, 100)


def mutate(data, pool, rng):
    if rng.random() < 0.3:
        # Structure-aware for JSON (after a leading picker byte, if any).
        for skip in (0, 1):
            try:
                value = json.loads(data[skip:].decode())
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            text = json.dumps(_json_mutant(value, rng), indent=rng.choice([None, 1]))
            return data[:skip] + text.encode()
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        roll = rng.randrange(8)
        n = len(data)
        if roll == 0 and n:
            data[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif roll == 1 and n:
            data[rng.randrange(n)] = rng.randrange(256)
        elif roll == 2:
            at = rng.randint(0, n)
            data[at:at] = str(rng.choice(EDGES)).encode()
        elif roll == 3:
            at = rng.randint(0, n)
            data[at:at] = bytes(rng.choice(b"\n\r\t #:@=,{}[]\"\\\x00\xff0") for _ in range(
                rng.randint(1, 8)))
        elif roll == 4 and n:
            at = rng.randrange(n)
            del data[at:at + rng.randint(1, n - at)]
        elif roll == 5 and n:
            at = rng.randrange(n)
            piece = data[at:at + rng.randint(1, 64)]
            where = rng.randint(0, len(data))
            data[where:where] = piece
        elif roll == 6:
            del data[rng.randint(0, n):]
        elif roll == 7 and pool:
            other = rng.choice(pool)
            data = data[:rng.randint(0, n)] + bytearray(other[rng.randint(0, len(other)):])
    return bytes(data)


# --- the driver

def run_one(target, data, scratch, again=True):
    tracemalloc.reset_peak()
    start = time.monotonic()
    try:
        outcome = target(data, scratch)
    except Finding:
        raise
    except Exception as e:  # noqa: BLE001 - any other exception is the finding
        raise Finding(f"{type(e).__name__}: {e}") from e
    took = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1]
    if peak > MAX_TRACED_BYTES:
        raise Finding(f"allocated {peak} bytes at its peak")
    if took > MAX_SECONDS:
        # A busy machine stalls an input of a millisecond past a second
        # (seen at load 18): slow twice in a row is a finding.
        if not again:
            raise Finding(f"took {took:.2f} s, twice")
        return run_one(target, data, scratch, again=False)
    return outcome


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="mutants per target, seconds")
    parser.add_argument("--seed", type=int, default=int(os.environ.get(
        "DDL_FUZZ_SEED", datetime.date.today().strftime("%Y%m%d"))))
    parser.add_argument("--target", action="append", choices=sorted(TARGETS))
    parser.add_argument("--corpus", default=CORPUS)
    parser.add_argument("--findings", default=tempfile.gettempdir())
    parser.add_argument("--write-seeds", action="store_true")
    args = parser.parse_args(argv)
    checks = 0
    tracemalloc.start()
    for name in args.target or sorted(TARGETS):
        target, seeds = TARGETS[name]
        folder = os.path.join(args.corpus, name)
        if args.write_seeds:
            os.makedirs(folder, exist_ok=True)
            for i, seed in enumerate(seeds()):
                with open(os.path.join(folder, f"seed-{i}"), "wb") as f:
                    f.write(seed)
            continue
        with tempfile.TemporaryDirectory(prefix=f"ddl_fuzz_{name}_") as scratch:
            pool = []
            current = None
            try:
                for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                    with open(os.path.join(folder, entry), "rb") as f:
                        current = f.read()
                    outcome = run_one(target, current, scratch)
                    print(f"{name}/{entry}: " + (f"refused: {outcome}" if outcome else "decoded"))
                    pool.append(current)
                    checks += 1
                for seed in seeds():
                    current = seed
                    run_one(target, seed, scratch)
                    pool.append(seed)
                    checks += 1
                rng = random.Random(f"{args.seed}/{name}")
                end, mutants = time.monotonic() + args.seconds, 0
                while time.monotonic() < end:
                    current = mutate(rng.choice(pool), pool, rng)
                    run_one(target, current, scratch)
                    mutants += 1
            except Finding as e:
                kept = os.path.join(args.findings, f"ddl_fuzz_finding_{name}_{args.seed}")
                with open(kept, "wb") as f:
                    f.write(current)
                print(f"FUZZ FINDING: {name}: {e}\ninput: {kept} (seed {args.seed})",
                      file=sys.stderr)
                return 1
            checks += mutants
            print(f"{name}: {len(pool)} corpus files and seeds, {mutants} mutants")
    print(f"{checks} checks, 0 failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
