"""Nothing lost on bad files: a damaged or cut-short backup, results file
or hostfile is refused with an error naming the file, and a save that
fails part-way, whatever the fault, leaves the previous backup (and
results file) exactly as it was. (The autotune table's refusals are
checked with the tuner, tests/core/autotune_check.cc; every decoder is
also fuzzed, tests/core/test_fuzz.py.)"""

import json
import os
import random
import sys

import numpy as np
import pytest

from keras_ddl.keras import backup_store
from keras_ddl_launcher.hosts import UsageError, hostfile_items, read_hostfile
from keras_ddl_tools import results

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "core", "fuzz"))
from files import mutate  # noqa: E402  (the fuzz driver's mutations)


def arrays(scale):
    return [("dense/kernel", np.arange(12, dtype=np.float32).reshape(3, 4) * scale),
            ("dense/bias", np.array([1, -2, 3], np.int64) * scale),
            ("step", np.array(scale, np.int64))]


def save(folder, epoch, scale):
    meta = {"position": {"epoch": epoch, "world_size": 2}, "root_rank": 0}
    blobs = {r: backup_store.npz_bytes({"own_0": np.full([2], r * scale, np.float32)})
             for r in (0, 1)}
    return backup_store.write_backup(str(folder), backup_store.backup_name(epoch, 0), meta,
                                     arrays(scale), blobs)


def snapshot(path):
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path))}


def loads_as_saved(path, scale):
    """The backup verifies and gives back exactly what was saved."""
    meta = backup_store.read_meta(path)
    backup_store.verify(path, meta)
    got = backup_store.read_variables(path, meta)
    for (name, dtype, shape, raw), (want_name, want) in zip(got, arrays(scale)):
        assert name == want_name
        assert raw.view(np.dtype(dtype)).reshape(shape).tobytes() == want.tobytes()
    return True


class Fault(Exception):
    pass


def _write_half_then_fail(path, chunks):
    chunks = list(chunks)
    with open(path, "wb") as f:
        for chunk in chunks[:max(1, len(chunks) // 2)]:
            f.write(bytes(chunk)[:len(chunk) // 2 + 1])
    raise Fault(f"injected while writing {path}")


def _fault(kind, monkeypatch):
    """Makes the next save fail at one point."""
    if kind == "variables.bin half written":
        monkeypatch.setattr(backup_store, "_write", _write_half_then_fail)
    elif kind == "a rank file":
        real, calls = backup_store._write, []

        def second_fails(path, chunks):
            calls.append(path)
            if len(calls) == 2:
                _write_half_then_fail(path, chunks)
            return real(path, chunks)
        monkeypatch.setattr(backup_store, "_write", second_fails)
    elif kind == "meta.json mid-dump":
        def dump_fails(obj, f, **kwargs):
            f.write('{"position": {"ep')
            raise Fault("injected in json.dump")
        monkeypatch.setattr(json, "dump", dump_fails)
    elif kind == "interrupt at fsync":
        def fsync_interrupted(fd):
            raise KeyboardInterrupt
        monkeypatch.setattr(os, "fsync", fsync_interrupted)
    elif kind == "the rename into place":
        real_rename = os.rename

        def rename_fails(src, dst):
            if ".partial-" in str(src):
                raise OSError(5, "injected: input/output error")
            return real_rename(src, dst)
        monkeypatch.setattr(os, "rename", rename_fails)
    elif kind == "the room check":
        monkeypatch.setattr(backup_store, "free_bytes", lambda d: 10)


FAULTS = ["variables.bin half written", "a rank file", "meta.json mid-dump",
          "interrupt at fsync", "the rename into place", "the room check"]


@pytest.mark.parametrize("kind", FAULTS)
def test_a_save_that_fails_part_way_leaves_the_previous_backup_bitwise(tmp_path, monkeypatch,
                                                                       kind):
    previous = save(tmp_path, 1, 1)
    before = snapshot(previous)
    _fault(kind, monkeypatch)
    with pytest.raises((Fault, KeyboardInterrupt, OSError)):
        save(tmp_path, 2, 2)
    monkeypatch.undo()
    assert snapshot(previous) == before
    assert [p for _, p in backup_store.list_backups(str(tmp_path))] == [previous]
    assert loads_as_saved(previous, 1)
    # Nothing half-written is left where a later save or load would see it.
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(previous)]


# A process killed between the two renames that replace a backup of the
# same name (a run that fell back past epoch 2 saves epoch 2 again): the
# save runs in a child whose rename of the new backup into place ends the
# process at once (os._exit: no handler runs, as with SIGKILL). The
# child uses the source tree's backup_store (tests/core/fuzz/files.py
# loads it without TensorFlow).
KILLED_SAVE = """
import os, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from files import backup_store
real = os.rename
os.rename = lambda src, dst: os._exit(9) if ".partial-" in str(src) else real(src, dst)
backup_store.write_backup(sys.argv[2], "epoch-000002", {"position": {}, "root_rank": 0},
                          [("x", np.ones([3]))], {0: b"new"})
"""


def test_a_save_killed_while_replacing_a_backup_leaves_it_loadable(tmp_path):
    import subprocess
    old = save(tmp_path, 2, 1)
    before = snapshot(old)
    here = os.path.dirname(os.path.abspath(__file__))
    fuzz = os.path.join(os.path.dirname(here), "core", "fuzz")
    proc = subprocess.run([sys.executable, "-c", KILLED_SAVE, fuzz, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert not os.path.exists(old)
    # The next run still finds it, and the next save's clean-up puts it
    # back in place instead of deleting it with the partial.
    [(_, found)] = backup_store.list_backups(str(tmp_path))
    assert snapshot(found) == before and loads_as_saved(found, 1)
    removed = []
    backup_store.remove_partials(str(tmp_path), removed.append)
    assert len(removed) == 1 and os.listdir(tmp_path) == ["epoch-000002"]
    assert snapshot(old) == before and loads_as_saved(old, 1)


def corruptions(newest):
    """(file, new bytes) pairs: cut short, a flipped byte, emptied, and
    seeded fuzz mutants of meta.json."""
    rng = random.Random(49)
    files = snapshot(newest)
    meta = files[backup_store.META]
    out = [(backup_store.VARIABLES, files[backup_store.VARIABLES][:-7]),
           (backup_store.rank_file(1), files[backup_store.rank_file(1)][:10]),
           (backup_store.META, meta[:len(meta) // 2]), (backup_store.META, b"")]
    flipped = bytearray(files[backup_store.VARIABLES])
    flipped[len(flipped) // 2] ^= 0x40
    out.append((backup_store.VARIABLES, bytes(flipped)))
    while len(out) < 40:
        mutant = mutate(meta, [meta], rng)
        if mutant != meta:
            out.append((backup_store.META, mutant))
    return out


def test_a_damaged_newest_backup_is_refused_naming_its_file_and_the_previous_loads(tmp_path):
    previous = save(tmp_path, 1, 1)
    before = snapshot(previous)
    newest = save(tmp_path, 2, 2)
    pristine = snapshot(newest)
    refused = 0
    for name, data in corruptions(newest):
        for n, content in pristine.items():
            with open(os.path.join(newest, n), "wb") as f:
                f.write(data if n == name else content)
        try:
            meta = backup_store.read_meta(newest)
            backup_store.verify(newest, meta)
            loaded = backup_store.read_variables(newest, meta)
        except backup_store.BackupError as e:
            assert str(e).startswith(newest + os.sep), e
            if name != backup_store.META:
                assert str(e).startswith(os.path.join(newest, name)), e
            refused += 1
            continue
        # A mutant of meta.json that still says what was written (a
        # space added, a key reordered) loads exactly what was saved.
        assert name == backup_store.META
        for (_, dtype, shape, raw), (_, want) in zip(loaded, arrays(2)):
            assert raw.view(np.dtype(dtype)).reshape(shape).tobytes() == want.tobytes()
    assert refused >= 30
    assert snapshot(previous) == before and loads_as_saved(previous, 1)


def test_a_damaged_results_file_is_refused_naming_it(tmp_path):
    launch = {"meta": {"date": "d", "commit": "c", "command": "x", "machine": {}},
              "rows": [{"size": "1 MB", "seconds": 0.5}]}
    path = str(tmp_path / "demo.json")
    results.save(results.merge([launch], "demo", "python -m keras_ddl.bench x", "idle"), path)
    good = open(path, "rb").read()
    assert results.load_all(str(tmp_path))["demo"]["name"] == "demo"
    for damaged, why in [(good[:len(good) // 2], "not JSON (cut short or damaged?)"),
                         (good.replace(b'"launches"', b'"lunches"'),
                          "not a complete results file: missing field 'launches'"),
                         (b"\xff" + good, "byte 0 is not UTF-8 text"),
                         (b"[" * 100000, "nested too deeply")]:
        with open(path, "wb") as f:
            f.write(damaged)
        with pytest.raises(results.ResultsFileError) as e:
            results.load_all(str(tmp_path))
        assert str(e.value).startswith(f"{path}: ") and why in str(e.value), e.value
    # The command line names it too, without a traceback.
    with pytest.raises(SystemExit, match=f"results merge: {path}: "):
        results.main(["merge", "--name", "x", "--command", "c", "--conditions", "c",
                      "-o", str(tmp_path / "out.json"), path])


def test_a_results_save_that_fails_part_way_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / "demo.json")
    results.save({"name": "first"}, path)
    before = open(path, "rb").read()
    with pytest.raises(TypeError):
        results.save({"name": "second", "bad": object()}, path)  # fails inside json.dump
    assert open(path, "rb").read() == before and os.listdir(tmp_path) == ["demo.json"]


@pytest.mark.parametrize("content,where,why", [
    (b"node1 slots=2\nnode2 slo", ":2: 'slo' is not understood", "cut mid-word"),
    (b"node1 slots=2\nnode2 slots=", ":2: slots= '' is not a whole number", "cut after ="),
    (b"node1\nnode2\n\xc3", ":3: byte 0xc3 is not UTF-8 text", "cut mid-character"),
    (b"node1\n\x00\x00\x00\x00", ":2: a NUL byte", "zeroed blocks"),
])
def test_a_damaged_hostfile_is_refused_naming_file_and_line(tmp_path, content, where, why):
    path = tmp_path / "hosts"
    path.write_bytes(content)
    with pytest.raises(UsageError) as e:
        hostfile_items(read_hostfile(str(path)), str(path))
    assert str(e.value).startswith(f"{path}{where}"), (why, e.value)


def test_a_hostfile_that_is_no_file_is_refused_naming_it(tmp_path):
    with pytest.raises(UsageError, match=f"--hostfile {tmp_path} is not a regular file"):
        read_hostfile(str(tmp_path))
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate((16 << 20) + 1)
    with pytest.raises(UsageError, match=f"--hostfile {big} is larger than"):
        read_hostfile(str(big))
