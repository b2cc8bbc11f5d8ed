"""The files of a BackupAndRestore backup, written so that a reader never
sees half of one.

A backup is a directory ``epoch-EEEEEE`` (the state after E epochs) or
``epoch-EEEEEE-step-SSSSSSSSS`` (after S more batches of epoch E) holding

- ``variables.bin``: the model's and optimizer's variables as root_rank
  holds them, each in C order, one after the other;
- ``rank-RRRRR.npz``: what each rank holds for itself (non-trainable model
  variables, metric variables, its tf.data iterator state);
- ``meta.json``: the position, the index of ``variables.bin`` (path, dtype,
  shape, offset of every variable), and the size and CRC-32 of every other
  file (a check against a copy cut short or a damaged disk; CRC-32 reads
  ResNet-50's 205 MB in less than half of SHA-256's time).

It is written under ``.partial-*`` and renamed into place once every file
is on disk (fsync'd), so a process killed while saving, or a full disk,
leaves the previous backup as the newest complete one.
"""

import errno
import glob
import io
import json
import os
import re
import shutil
import threading
import zlib

import numpy as np

_NAME = re.compile(r"^epoch-(\d{6,})(?:-step-(\d{9,}))?$")
VARIABLES = "variables.bin"
_ALIGN = 64
META = "meta.json"


def backup_name(epoch, step):
    return f"epoch-{epoch:06d}" if step == 0 else f"epoch-{epoch:06d}-step-{step:09d}"


def rank_file(rank):
    return f"rank-{rank:05d}.npz"


def list_backups(backup_dir):
    """Complete backups as [((epoch, step), directory)], oldest first."""
    found = []
    for path in glob.glob(os.path.join(backup_dir, "epoch-*")):
        match = _NAME.match(os.path.basename(path))
        if match and os.path.isfile(os.path.join(path, META)):
            found.append(((int(match.group(1)), int(match.group(2) or 0)), path))
    return sorted(found)


def free_bytes(directory):
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path, chunks):
    """Writes the byte chunks to `path`, fsync'd; returns [bytes, CRC-32]."""
    crc, size = 0, 0
    with open(path, "wb") as f:
        for chunk in chunks:
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return [size, crc]


def _checksum(path):
    crc, size = 0, 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return [size, crc]


def as_bytes(array):
    """A C-order uint8 view of `array` (any dtype, any rank, 0-d included)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def npz_bytes(arrays):
    """`arrays` ({name: ndarray}) as the bytes of an .npz file (no pickles)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def read_npz_bytes(data):
    with np.load(io.BytesIO(data), allow_pickle=False) as f:
        return {name: f[name] for name in f.files}


def check_room(directory, nbytes):
    """Raises ENOSPC before writing if `nbytes` (plus some slack) cannot fit,
    so that a full disk is a clear error before any byte is written."""
    needed = int(nbytes * 1.02) + 64 * 1024
    free = free_bytes(directory)
    if free < needed:
        raise OSError(errno.ENOSPC, f"No space left on device: the backup needs about "
                                    f"{needed} bytes, {free} are free")


def write_backup(backup_dir, name, meta, arrays, rank_blobs):
    """Writes one backup atomically; returns its directory.

    Args:
        meta: JSON-able dict (the position and what the caller wants kept);
            the variable index and checksums are added here.
        arrays: [(path, array)] in the order the caller restores them; an
            array is anything ``np.asarray`` takes (a snapshot tensor is
            converted here, in the writing thread).
        rank_blobs: {rank: bytes of an .npz}.
    """
    arrays = [(path, np.asarray(array)) for path, array in arrays]
    os.makedirs(backup_dir, exist_ok=True)
    final = os.path.join(backup_dir, name)
    partial = os.path.join(backup_dir, f".partial-{name}-{os.getpid()}")
    os.makedirs(partial)
    try:
        nbytes = sum(a.nbytes for _, a in arrays) + sum(len(b) for b in rank_blobs.values())
        check_room(partial, nbytes)
        index, offset, chunks = [], 0, []
        for path, array in arrays:
            pad = -offset % _ALIGN  # every array starts on a 64-byte boundary
            if pad:
                chunks.append(np.zeros([pad], np.uint8))
                offset += pad
            index.append({"path": path, "dtype": array.dtype.name, "shape": list(array.shape),
                          "offset": offset, "nbytes": int(array.nbytes)})
            chunks.append(as_bytes(array))
            offset += array.nbytes
        files = {VARIABLES: _write(os.path.join(partial, VARIABLES), chunks)}
        for rank, blob in sorted(rank_blobs.items()):
            files[rank_file(rank)] = _write(os.path.join(partial, rank_file(rank)), [blob])
        meta = dict(meta, variables=index, files=files)
        with open(os.path.join(partial, META), "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if os.path.exists(final):  # left by a run that fell back past it
        stale = partial + ".stale"
        os.rename(final, stale)
        os.rename(partial, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.rename(partial, final)
    _fsync(backup_dir)
    return final


def remove_partials(backup_dir, report):
    """Removes ``.partial-*`` directories (left by an interrupted save)."""
    for partial in glob.glob(os.path.join(backup_dir, ".partial-*")):
        report(partial)
        shutil.rmtree(partial, ignore_errors=True)


def prune(backup_dir, keep):
    for _, old in list_backups(backup_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def read_meta(path):
    with open(os.path.join(path, META)) as f:
        return json.load(f)


def verify(path, meta):
    """Raises ValueError if a file of the backup does not match its checksum."""
    for name, expected in meta["files"].items():
        if _checksum(os.path.join(path, name)) != list(expected):
            raise ValueError(f"{os.path.join(path, name)} does not match the checksum in {META}")


def read_variables(path, meta):
    """The arrays of ``variables.bin`` as [(path, dtype string, uint8 view)]."""
    raw = np.fromfile(os.path.join(path, VARIABLES), dtype=np.uint8)
    return [(v["path"], v["dtype"], v["shape"], raw[v["offset"]:v["offset"] + v["nbytes"]])
            for v in meta["variables"]]


class BackgroundWriter:
    """Runs one write at a time in a thread of its own. ``submit`` waits for
    the previous write and raises its error, if it failed; ``wait`` too."""

    def __init__(self):
        self._thread = None
        self._error = None
        self.last = None  # what the last successful write returned

    def _run(self, job):
        try:
            self.last = job()
        except BaseException as e:  # handed to the training thread
            self._error = e

    def wait(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self.last

    def submit(self, job):
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(job,),
                                        name="keras_ddl-backup-writer", daemon=True)
        self._thread.start()
