"""Back up training state every epoch; resume from the last backup after a kill.

```python
callbacks = [ddl.callbacks.BackupAndRestore("/shared/run1/backup")]
model.fit(dataset, epochs=90, callbacks=callbacks)   # the same command after a crash
```

One rank (``root_rank``) writes and reads the backups; on restore it
broadcasts what it read, so the other ranks need no access to the
directory. A backup is a directory ``epoch-NNNNNN`` holding the model's and
optimizer's variables (``state.weights.h5``, Keras' weights format, which
includes the optimizer's iteration count and slots, hence the learning-rate
schedule position) and ``meta.json`` (epoch, SHA-256 of the weights file).
It is written under a ``.partial-*`` name and renamed into place once
complete, so a process killed while saving leaves the previous backup as
the latest; the next save removes the partial one.
"""

import errno
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from ..tensorflow import private_api
from ..common import basics
from ..common.validation import check_rank_argument
from ..tensorflow.collectives import broadcast
from ..tensorflow.variable_broadcast import broadcast_variables

__all__ = ["BackupAndRestore"]

_BACKUP = re.compile(r"^epoch-(\d{6,})$")
_WEIGHTS = "state.weights.h5"
_META = "meta.json"


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_bytes(directory):
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def _check_room(directory, variables):
    """Raises ENOSPC before writing if the weights cannot fit: when the disk
    fills in the middle of Keras' HDF5 write, h5py crashes the process
    (a segmentation fault while closing the file) instead of raising."""
    needed = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
    # HDF5's own structures: tens of KB, and about 2 KB per dataset.
    needed = int(needed * 1.05) + 64 * 1024 + 2048 * len(variables)
    free = _free_bytes(directory)
    if free < needed:
        raise OSError(errno.ENOSPC, f"No space left on device: the backup needs about "
                                    f"{needed} bytes, {free} are free")


def _warn(text):
    sys.stderr.write(f"[keras_ddl] rank {basics.rank()}: {text}\n")
    sys.stderr.flush()


class BackupAndRestore(keras.callbacks.Callback):
    """Saves the training state at each epoch end; restores it when `fit` starts.

    Give it to `fit` on every rank. At `on_train_begin`, `root_rank` loads
    the newest complete backup in `backup_dir` (falling back to older ones
    if the newest does not verify or load), broadcasts the weights and
    optimizer state to every rank, and `fit` continues with the epoch after
    the one the backup ended. At every epoch end `root_rank` writes a new
    backup and keeps the newest `keep`. Backups are kept after `fit`
    returns; a finished run restarted with the same `epochs` trains nothing.

    For a resumed run to end with the same weights as an uninterrupted one,
    each epoch must see the same batches in the same order whatever run it
    is in: a finite dataset that `fit` iterates afresh each epoch, shuffled
    (if at all) with an order that depends on the seed and the epoch only.
    A run killed mid-epoch repeats that epoch from its start.

    Args:
        backup_dir: directory for the backups (created on `root_rank`). Use
            one directory per training run and nothing else in it.
        keep: number of complete backups kept (at least 1; the default 2
            leaves one to fall back on if the newest is damaged later).
        root_rank: the rank that writes, reads and broadcasts the backups.
    """

    def __init__(self, backup_dir, keep=2, root_rank=0):
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not str(backup_dir):
            raise ValueError(f"keras_ddl: BackupAndRestore backup_dir must be a non-empty path, "
                             f"got {backup_dir!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keras_ddl: BackupAndRestore keep must be an int >= 1, got {keep!r}")
        check_rank_argument(root_rank, "root_rank", "BackupAndRestore", in_range=True)
        self.backup_dir = os.fspath(backup_dir)
        self.keep = keep
        self.root_rank = root_rank
        self.restored_epoch = 0  # epochs done according to the backup fit started from

    # ------------------------------------------------------------ layout

    def _is_root(self):
        return basics.rank() == self.root_rank

    def backups(self):
        """Complete backups as [(epoch, directory)], oldest first."""
        found = []
        for path in glob.glob(os.path.join(self.backup_dir, "epoch-*")):
            match = _BACKUP.match(os.path.basename(path))
            if match and os.path.isfile(os.path.join(path, _META)):
                found.append((int(match.group(1)), path))
        return sorted(found)

    def _variables(self):
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            variables += list(optimizer.variables)
        return variables

    # ------------------------------------------------------------ restore

    def _load(self, path):
        with open(os.path.join(path, _META)) as f:
            meta = json.load(f)
        weights = os.path.join(path, _WEIGHTS)
        if _sha256(weights) != meta["sha256"]:
            raise ValueError(f"{weights} does not match the checksum in {_META}")
        self.model.load_weights(weights)
        return int(meta["epoch"])

    def _restore_on_root(self):
        """Loads the newest backup that verifies; returns its epoch, 0 if none."""
        failures = []
        for epoch, path in reversed(self.backups()):
            try:
                loaded = self._load(path)
            except Exception as e:  # damaged backup: try the one before
                failures.append(f"{path}: {type(e).__name__}: {e}")
                continue
            for failure in failures:
                _warn(f"BackupAndRestore skipped a backup that does not load ({failure})")
            return loaded
        if failures:
            raise RuntimeError("keras_ddl: BackupAndRestore found backups in "
                               f"{self.backup_dir} but none loads:\n  " + "\n  ".join(failures))
        return 0

    def on_train_begin(self, logs=None):
        if not self.model.built:
            raise ValueError("keras_ddl: BackupAndRestore needs a built model (give it an "
                             "Input, or call it on a batch, before fit)")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        epoch, error = 0, None
        if self._is_root():
            try:
                epoch = self._restore_on_root()
            except Exception as e:
                epoch, error = -1, e
        if basics.size() > 1:
            # Every rank learns the outcome, so a failed restore is an error
            # everywhere instead of ranks waiting for a broadcast that never comes.
            epoch = int(broadcast(tf.constant([epoch], tf.int64), self.root_rank,
                                  name="backup_and_restore.epoch")[0])
        if error is not None:
            raise error
        if epoch < 0:
            raise RuntimeError(f"keras_ddl: BackupAndRestore could not restore from "
                               f"{self.backup_dir} on rank {self.root_rank} (see its error)")
        if epoch > 0 and basics.size() > 1:
            broadcast_variables(self._variables(), root_rank=self.root_rank)
        self.restored_epoch = epoch
        if epoch > 0:
            # Keras' own BackupAndRestore resumes the same way: fit reads this
            # attribute after on_train_begin.
            private_api.set_initial_epoch(self.model, epoch)

    def on_train_end(self, logs=None):
        # A later fit on this model starts where its caller says again.
        private_api.set_initial_epoch(self.model, None)

    # ------------------------------------------------------------ save

    def on_epoch_end(self, epoch, logs=None):
        if self._is_root():
            self.save(epoch + 1)

    def _write(self, partial, epoch):
        """Writes the weights and meta.json of `epoch` into the directory `partial`."""
        os.makedirs(partial)
        _check_room(partial, self._variables())
        weights = os.path.join(partial, _WEIGHTS)
        self.model.save_weights(weights)
        _fsync(weights)
        meta = {"epoch": epoch, "sha256": _sha256(weights), "ranks": basics.size(),
                "keras": keras.__version__, "time": time.time()}
        with open(os.path.join(partial, _META), "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())

    def save(self, epoch):
        """Writes the backup of `epoch` completed epochs (call on root_rank)."""
        os.makedirs(self.backup_dir, exist_ok=True)
        for partial in glob.glob(os.path.join(self.backup_dir, ".partial-*")):
            _warn(f"BackupAndRestore removes {partial}, left by an interrupted save")
            shutil.rmtree(partial, ignore_errors=True)
        final = os.path.join(self.backup_dir, f"epoch-{epoch:06d}")
        partial = os.path.join(self.backup_dir, f".partial-epoch-{epoch:06d}-{os.getpid()}")
        try:
            self._write(partial, epoch)
        except OSError as e:  # a full disk, a quota, a lost mount
            shutil.rmtree(partial, ignore_errors=True)
            kept = self.backups()
            previous = (f"the previous backup {kept[-1][1]} is intact" if kept
                        else "there is no earlier backup")
            raise OSError(e.errno, f"keras_ddl: BackupAndRestore could not write the backup of "
                                   f"epoch {epoch} in {self.backup_dir} on rank "
                                   f"{basics.rank()}: {e.strerror or e}; {previous}") from e
        if os.path.exists(final):  # left by a run that fell back past it
            stale = partial + ".stale"
            os.rename(final, stale)
            os.rename(partial, final)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.rename(partial, final)
        _fsync(self.backup_dir)
        for _, old in self.backups()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final
