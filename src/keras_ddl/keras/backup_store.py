"""The files of a BackupAndRestore backup, written so that a reader never
sees half of one.

A backup is a directory ``epoch-EEEEEE`` (the state after E epochs) or
``epoch-EEEEEE-step-SSSSSSSSS`` (after S more batches of epoch E) holding

- ``variables.bin``: the model's and optimizer's variables as root_rank
  holds them, each in C order, one after the other;
- ``rank-RRRRR.npz``: what each rank holds for itself (non-trainable model
  variables, metric variables, its tf.data iterator state);
- ``meta.json``: the position, the index of ``variables.bin`` (path, dtype,
  shape, offset of every variable), the size and CRC-32 of every other
  file, and a CRC-32 of its own values (checks against a copy cut short
  or a damaged disk; CRC-32 reads ResNet-50's 205 MB in less than half of
  SHA-256's time). Every file is checked before it is used (check_meta,
  verify): a damaged backup is refused with a BackupError naming its file.

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
_REPLACED = ".replaced-"
_META_CRC = "meta_crc"


def backup_name(epoch, step):
    return f"epoch-{epoch:06d}" if step == 0 else f"epoch-{epoch:06d}-step-{step:09d}"


def rank_file(rank):
    return f"rank-{rank:05d}.npz"


def _replaced_name(path):
    """The backup name of a ``.replaced-NAME-PID`` directory, or None."""
    name = os.path.basename(path)[len(_REPLACED):].rpartition("-")[0]
    return name if _NAME.match(name) else None


def list_backups(backup_dir):
    """Complete backups as [((epoch, step), directory)], oldest first: with
    a backup that an interrupted save was replacing (``.replaced-*``) in
    its place when its own directory is missing."""
    found = {}
    for path in glob.glob(os.path.join(backup_dir, _REPLACED + "*")):
        name = _replaced_name(path)
        if name and os.path.isfile(os.path.join(path, META)):
            found[name] = path
    for path in glob.glob(os.path.join(backup_dir, "epoch-*")):
        if _NAME.match(os.path.basename(path)) and os.path.isfile(os.path.join(path, META)):
            found[os.path.basename(path)] = path
    return sorted(((int(m.group(1)), int(m.group(2) or 0)), path)
                  for m, path in ((_NAME.match(n), p) for n, p in found.items()))


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
        meta[_META_CRC] = _meta_crc(meta)
        with open(os.path.join(partial, META), "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    try:
        if os.path.exists(final):  # left by a run that fell back past it
            # Between the two renames the old backup exists only under this
            # name: a process killed there leaves it complete, and
            # list_backups and remove_partials take it back (it is never
            # deleted as a partial); a rename that fails puts it back here.
            replaced = os.path.join(backup_dir, f"{_REPLACED}{name}-{os.getpid()}")
            os.rename(final, replaced)
            try:
                os.rename(partial, final)
            except BaseException:
                os.rename(replaced, final)
                raise
            shutil.rmtree(replaced, ignore_errors=True)
        else:
            os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _fsync(backup_dir)
    return final


def remove_partials(backup_dir, report):
    """Removes ``.partial-*`` directories (left by an interrupted save), and
    puts back a backup a save was replacing when it was interrupted."""
    for partial in glob.glob(os.path.join(backup_dir, ".partial-*")):
        report(partial)
        shutil.rmtree(partial, ignore_errors=True)
    for replaced in glob.glob(os.path.join(backup_dir, _REPLACED + "*")):
        name = _replaced_name(replaced)
        final = os.path.join(backup_dir, name) if name else None
        if final and not os.path.exists(final):
            os.rename(replaced, final)
        else:
            shutil.rmtree(replaced, ignore_errors=True)


def prune(backup_dir, keep):
    for _, old in list_backups(backup_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


class BackupError(ValueError):
    """A backup that cannot be loaded; the message names its file and what
    is wrong with it."""


# meta.json holds a few hundred bytes per variable: a model of 100,000
# variables stays well below this. A larger file is refused unread.
MAX_META_BYTES = 64 << 20
_RANK_FILE = re.compile(r"^rank-\d{5,}\.npz$")


def _whole(value, low=0):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _meta_crc(meta):
    """CRC-32 of meta.json's values (not of its text: spacing and key order
    do not count), without its own entry."""
    values = {k: v for k, v in meta.items() if k != _META_CRC}
    return zlib.crc32(json.dumps(values, sort_keys=True, separators=(",", ":")).encode())


def check_meta(meta, where):
    """Raises BackupError naming `where` (the meta.json) unless `meta` is
    what write_backup writes: the files' sizes and CRC-32s (variables.bin
    and rank files only, no other path), and an index whose every variable
    has a numeric dtype, a shape, and an aligned range inside variables.bin
    of exactly its bytes."""
    def refuse(what):
        raise BackupError(f"{where}: {what}")
    if not isinstance(meta, dict):
        refuse(f"holds a JSON {type(meta).__name__}, not an object")
    files = meta.get("files")
    if not isinstance(files, dict) or VARIABLES not in files:
        refuse(f"'files' is not an object naming {VARIABLES}")
    for name, entry in files.items():
        # A name is joined to the backup's directory: nothing but our own.
        if name != VARIABLES and not _RANK_FILE.match(name):
            refuse(f"'files' names {name!r}, not {VARIABLES} or a rank-NNNNN.npz")
        if not (isinstance(entry, list) and len(entry) == 2 and _whole(entry[0])
                and _whole(entry[1]) and entry[1] < 1 << 32):
            refuse(f"'files' entry of {name} is not [size, CRC-32]")
    if not _whole(meta.get("root_rank")) or rank_file(meta["root_rank"]) not in files:
        refuse("'root_rank' is not a rank whose file the backup holds")
    if not isinstance(meta.get("position"), dict):
        refuse("'position' is not an object")
    variables = meta.get("variables")
    if not isinstance(variables, list):
        refuse("'variables' is not a list")
    end = files[VARIABLES][0]
    for i, v in enumerate(variables):
        if not isinstance(v, dict) or not isinstance(v.get("path"), str) or \
                not isinstance(v.get("dtype"), str):
            refuse(f"variable {i} has no path and dtype")
        try:
            dtype = np.dtype(v["dtype"])
        except (TypeError, ValueError):
            dtype = None
        # Numbers, booleans and ml_dtypes' (bfloat16 is a kind 'V'): no
        # objects, strings or records, whose bytes are not the values.
        if dtype is None or dtype.name != v["dtype"] or dtype.kind not in "biufcV" or \
                dtype.fields is not None or dtype.itemsize == 0:
            refuse(f"variable {i} ({v['path'][:200]}): dtype {v['dtype'][:40]!r} is not a "
                   "numeric dtype's name")
        shape = v.get("shape")
        if not isinstance(shape, list) or len(shape) > 64 or not all(_whole(d) for d in shape):
            refuse(f"variable {i} ({v['path'][:200]}): shape is not a list of sizes")
        offset, nbytes = v.get("offset"), v.get("nbytes")
        if not _whole(offset) or offset % _ALIGN or not _whole(nbytes) or \
                nbytes != int(np.prod(shape, dtype=object)) * dtype.itemsize or \
                offset + nbytes > end:
            refuse(f"variable {i} ({v['path'][:200]}): bytes {offset!r}+{nbytes!r} are not "
                   f"its {v['dtype']}{shape} at an aligned offset inside {VARIABLES} "
                   f"({end} bytes)")
    # Last, so a damaged field is named above when it can be: a value
    # changed within its range (an offset to another variable's) is caught
    # here. Backups written before the checksum was kept have none.
    if _META_CRC in meta and meta[_META_CRC] != _meta_crc(meta):
        refuse(f"its values do not match its own checksum '{_META_CRC}' (damaged or edited)")


def read_meta(path):
    """The backup's meta.json, checked (check_meta); BackupError naming the
    file if it cannot be read, is cut short or damaged."""
    where = os.path.join(path, META)
    try:
        with open(where, "rb") as f:
            # As many bytes as the file has (read(n) would allocate n first).
            data = f.read(min(os.fstat(f.fileno()).st_size, MAX_META_BYTES) + 1)
    except OSError as e:
        raise BackupError(f"{where}: cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_META_BYTES:
        raise BackupError(f"{where}: larger than {MAX_META_BYTES} bytes")
    try:
        meta = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BackupError(f"{where}: byte {e.start} is not UTF-8 (damaged?)") from None
    except RecursionError:
        raise BackupError(f"{where}: nested too deeply (damaged?)") from None
    except ValueError as e:
        raise BackupError(f"{where}: not JSON (cut short or damaged?): {e}") from None
    check_meta(meta, where)
    return meta


def verify(path, meta):
    """Raises BackupError naming the file if a file of the backup is missing
    or does not match its size and checksum in meta.json."""
    for name, (size, crc) in meta["files"].items():
        where = os.path.join(path, name)
        try:
            found = os.path.getsize(where)
        except OSError as e:
            raise BackupError(f"{where}: cannot be read: {e.strerror or e}") from None
        if found != size:
            raise BackupError(f"{where}: {found} bytes, {META} says {size} (cut short?)")
        if _checksum(where) != [size, crc]:
            raise BackupError(f"{where}: does not match the checksum in {META} (damaged)")


def read_variables(path, meta):
    """The arrays of ``variables.bin`` as [(path, dtype string, uint8 view)]
    (meta checked by check_meta, the file by verify)."""
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
