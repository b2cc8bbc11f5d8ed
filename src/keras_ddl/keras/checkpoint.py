"""Back up the training state every N batches or every epoch; resume a killed
run from the last backup, at the same or at another world size.

```python
backup = ddl.callbacks.BackupAndRestore("/shared/run1/backup", save_freq=100)
model.fit(x, y, batch_size=256, epochs=90, callbacks=[backup, ...])  # the same after a crash
```

What a backup holds: every variable of the model (weights, BatchNorm
statistics, the seed generators of Dropout and other random layers) and of
the optimizer (its step, hence the learning-rate schedule's position, and
its slots), Keras' global seed generator, the metrics' running state, the
position (the epoch, the batch within it, the global samples done in it,
the global batch, the world size that wrote it) and the input's position,
by kind of input given to ``fit``:

- numpy arrays or dense tensors: the batch index and the shuffle seed. The
  order of epoch ``e`` is a permutation of ``(seed, e)`` (Keras' own shuffle
  is replaced, as it has no seed); under DDLStrategy the batches are
  global, so the position holds at any world size.
- a ``tf.data`` pipeline: TensorFlow's checkpoint of each rank's iterator
  (buffers and reshuffling seeds included), restored at the same world size.
  At another size, or for a pipeline TensorFlow cannot save (a Python
  function or generator inside it), the interrupted epoch starts over, with
  a warning.
- an input the script builds from the backup's position
  (``keras_ddl.data.sample_index_dataset(..., backup=backup)``): nothing is
  saved for it; the position holds at any world size.
- a Python generator, a ``PyDataset`` and other inputs: a warning when
  ``fit`` starts; a resumed epoch starts at its first batch.

Writes are atomic: ``root_rank`` writes each backup under a ``.partial-*``
name, fsyncs it and renames it into place, by default in a background
thread while training goes on (the variables are copied first). A process
killed while saving, or a full disk, leaves the previous backup as the
newest complete one; a full disk is an error naming the backup kept.

The contract a resumed script sees (any world size):

- ``backup.resume_position()``, callable before ``fit`` on every rank (a
  collective), returns the ``TrainingPosition`` that ``fit`` will resume
  from: ``epoch`` (epochs done), ``step`` (batches done in that epoch),
  ``samples`` (global samples done in it: ``step * global_batch``),
  ``global_batch``, ``iterations`` (optimizer steps in all), ``world_size``
  (ranks of the run that wrote it). A fresh run gets position 0.
- In ``fit``: ``on_train_begin`` restores the state on every rank (rank
  ``root_rank`` reads, the others receive), then the callbacks after this
  one see ``on_epoch_begin(epoch)`` and ``on_train_batch_begin(step)``, the
  first batch not done, and the optimizer at ``iterations``.
- The global batch is the backup's. Where it does not divide over the new
  world size, the first ``global_batch % size`` ranks take one row more of
  each step (DDLStrategy's split; ``keras_ddl.data.rows_of_rank``); the
  steps per epoch, the learning rate and the schedules are unchanged, and a
  warning says so.
- The interrupted epoch sees each of its samples once, for arrays under
  DDLStrategy and for inputs built with ``sample_index_dataset``, at any
  world size; for a tf.data pipeline at the same world size.

Under ddlrun, ``root_rank`` also tells ddlrun each optimizer step it
finishes, each backup that is complete and the step an attempt resumed from
(keras_ddl/common/launcher_progress.py), so that after a restart ddlrun
prints the time the fault cost and the steps done again.
"""

import dataclasses
import functools
import json
import os
import random
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from ..tensorflow import private_api
from ..common import basics, launcher_progress
from ..common.validation import check_rank_argument
from ..tensorflow.collectives import alltoall, broadcast
from ..tensorflow.objects import broadcast_object
from ..tensorflow.variable_broadcast import broadcast_variables
from . import backup_store, fit_input

__all__ = ["BackupAndRestore", "TrainingPosition"]


@dataclasses.dataclass(frozen=True)
class TrainingPosition:
    """Where a backup stands (see the module docstring).

    ``samples`` is ``step * global_batch`` (None if the global batch is not
    known: a tf.data input of unknown batch size and no ``global_batch_size``
    given to BackupAndRestore).
    """
    epoch: int = 0
    step: int = 0
    global_batch: int = None
    iterations: int = 0
    world_size: int = 1
    shuffle_seed: int = 0
    input: str = "none"

    @property
    def samples(self):
        if self.step == 0:
            return 0
        return None if self.global_batch is None else self.step * self.global_batch


def _check_position(meta, where):
    """Raises BackupError naming `where` unless meta's position has only
    TrainingPosition's fields, each of its type (whole numbers >= 0, a
    world size >= 1, the input's kind a string), and its iterator epoch is
    a whole number or null."""
    def refuse(what):
        raise backup_store.BackupError(f"{where}: {what}")
    position = meta["position"]
    known = {f.name for f in dataclasses.fields(TrainingPosition)}
    for key, value in position.items():
        if key not in known:
            refuse(f"'position' has a field {key[:80]!r} that TrainingPosition has not")
        if key == "input":
            ok = isinstance(value, str)
        else:
            ok = (value is None and key == "global_batch") or (
                isinstance(value, int) and not isinstance(value, bool) and
                value >= (1 if key in ("world_size", "global_batch") else 0))
        if not ok:
            refuse(f"'position' {key} is {str(value)[:80]!r}, not a valid value")
    epoch = meta.get("iterator_epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
        refuse(f"'iterator_epoch' is {str(epoch)[:80]!r}, not a whole number or null")


def _warn(text):
    sys.stderr.write(f"[keras_ddl] rank {basics.rank()}: {text}\n")
    sys.stderr.flush()


def _gather_to_root(data, root):
    """Every rank's bytes on ``root`` (a list in rank order; None elsewhere)."""
    size = basics.size()
    if size == 1:
        return [data]
    rows = np.frombuffer(data, np.uint8)
    splits = [len(rows) if r == root else 0 for r in range(size)]
    out, received = alltoall(tf.constant(rows), splits=splits, name="backup_and_restore.gather")
    if basics.rank() != root:
        return None
    out, ends = out.numpy().tobytes(), np.cumsum(received.numpy())
    return [out[end - n:end] for n, end in zip(received.numpy(), ends)]


def _scatter_from_root(blobs, root):
    """Rank r gets ``blobs[r]`` of ``root`` (bytes)."""
    size = basics.size()
    if size == 1:
        return blobs[0]
    if basics.rank() == root:
        rows = np.frombuffer(b"".join(blobs), np.uint8)
        splits = [len(b) for b in blobs]
    else:
        rows, splits = np.zeros([0], np.uint8), [0] * size
    out, _ = alltoall(tf.constant(rows), splits=splits, name="backup_and_restore.scatter")
    return out.numpy().tobytes()


_GLOBAL_SEED_PATH = "keras_ddl/keras_global_seed_generator"


def _global_seed_generator():
    """Keras' global SeedGenerator (``keras.random`` calls without a seed),
    if one was made (``keras.src.backend.common.global_state``)."""
    try:
        from keras.src.backend.common import global_state
        return global_state.get_global_attribute("global_seed_generator")
    except Exception:
        return None


class BackupAndRestore(keras.callbacks.Callback):
    """Backs the training state up every `save_freq` batches or every epoch;
    restores the newest backup when `fit` starts.

    Give it to `fit` on every rank, first in the callback list (the
    callbacks after it then see the restored state). At `on_train_begin`,
    `root_rank` loads the newest complete backup in `backup_dir` (falling
    back to older ones if the newest does not verify against its
    checksums), every rank takes the state from it, and `fit` continues at
    the batch after the one the backup ended. Backups are kept after `fit` returns; a finished run
    restarted with the same `epochs` trains nothing. What is saved, for
    which inputs the position holds, and what a script resumed at another
    world size sees: see the module docstring.

    A resumed run ends with the weights of an uninterrupted one when every
    step depends only on the saved state: the callbacks' own Python state
    (`ReduceLROnPlateau`'s patience, `EarlyStopping`'s best value) is not
    saved, nor are Python's, numpy's and `tf.random`'s global generators.

    Args:
        backup_dir: directory for the backups (created on `root_rank`). Use
            one directory per training run and nothing else in it.
        save_freq: `"epoch"` (at each epoch end) or an int N: every N batches
            (counted across epochs, as Keras' BackupAndRestore does), and at
            the end of `fit`. A fault then costs at most N steps plus the
            restart.
        keep: number of complete backups kept (at least 1; the default 2
            leaves one to fall back on if the newest is damaged later).
        root_rank: the rank that writes, reads and broadcasts the backups.
        background: write each backup in a background thread (True, default)
            once its variables are copied, so that training goes on during
            the write; an error of a background write is raised at the next
            save or at the end of `fit`. False writes before training goes on.
        global_batch_size: samples per step over all ranks, recorded in the
            position; needed only for a tf.data input whose batch size is not
            static (arrays and `sample_index_dataset` tell it themselves).
    """

    def __init__(self, backup_dir, save_freq="epoch", keep=2, root_rank=0, background=True,
                 global_batch_size=None):
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not str(backup_dir):
            raise ValueError(f"keras_ddl: BackupAndRestore backup_dir must be a non-empty path, "
                             f"got {backup_dir!r}")
        if save_freq != "epoch" and (isinstance(save_freq, bool) or
                                     not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError("keras_ddl: BackupAndRestore save_freq must be 'epoch' or an int >= "
                             f"1 (batches between backups), got {save_freq!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keras_ddl: BackupAndRestore keep must be an int >= 1, got {keep!r}")
        if global_batch_size is not None and (isinstance(global_batch_size, bool) or
                                              not isinstance(global_batch_size, int) or
                                              global_batch_size < 1):
            raise ValueError("keras_ddl: BackupAndRestore global_batch_size must be None or an "
                             f"int >= 1, got {global_batch_size!r}")
        check_rank_argument(root_rank, "root_rank", "BackupAndRestore", in_range=True)
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.keep = keep
        self.root_rank = root_rank
        self.background = bool(background)
        self.global_batch_size = global_batch_size
        self.position = TrainingPosition(world_size=basics.size())
        self.restored_epoch = 0  # epochs done according to the backup fit started from
        self._chosen = None      # (path, meta) resume_position found, or (None, None)
        self._positioned_by_script = None  # the input's global batch (0: not said)
        self._writer = backup_store.BackgroundWriter()
        self._input = None
        self._metric_values = None

    # ------------------------------------------------------------ layout

    def _is_root(self):
        return basics.rank() == self.root_rank

    def backups(self):
        """Complete backups as [((epoch, step), directory)], oldest first."""
        return backup_store.list_backups(self.backup_dir)

    def _shared_variables(self):
        """Variables every rank holds alike (root_rank's are written)."""
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            variables += list(optimizer.variables)
        return variables

    def _own_variables(self):
        """Variables a rank may hold a value of its own in (every rank's are
        written): non-trainable model state (BatchNorm statistics under
        DistributedOptimizer, seed generators) and the metrics."""
        return list(self.model.non_trainable_variables) + list(self.model.metrics_variables)

    # ------------------------------------------------------------ the position

    def resume_position(self):
        """The position `fit` will resume from (position 0 if there is no
        backup). Call it on every rank (a collective); the backup it finds
        is the one `fit` loads."""
        if self._chosen is None:
            self._chosen = self._choose()
        meta = self._chosen[1]
        return TrainingPosition(world_size=basics.size()) if meta is None \
            else TrainingPosition(**meta["position"])

    def use_positioned_input(self, global_batch=None):
        """Declares that the script builds the input of `fit` from this
        backup's position (`keras_ddl.data.sample_index_dataset(backup=self)`
        calls it), so that no iterator state is saved for it and the resumed
        epoch starts at the backup's batch with whatever the input yields
        first. Returns the resume position. `global_batch`: the input's
        samples per step over all ranks, which must be the backup's."""
        position = self.resume_position()
        if global_batch is None:
            self._positioned_by_script = self._positioned_by_script or 0
            return position
        if position.global_batch is not None and position.global_batch != global_batch:
            raise ValueError(f"keras_ddl: the backup in {self.backup_dir} was written with a "
                             f"global batch of {position.global_batch}, the input asks for "
                             f"{global_batch}: keep the global batch of a run across restarts")
        self._positioned_by_script = int(global_batch)
        return position

    def _choose(self):
        """root_rank picks the newest backup that verifies; every rank gets
        (path, meta), or (None, None) if there is none."""
        choice, error = (None, None), None
        if self._is_root():
            failures = []
            for _, path in reversed(self.backups()):
                try:
                    meta = backup_store.read_meta(path)
                    _check_position(meta, os.path.join(path, backup_store.META))
                    backup_store.verify(path, meta)
                except Exception as e:  # damaged backup: try the one before
                    failures.append(f"{path}: {type(e).__name__}: {e}")
                    continue
                choice = (path, meta)
                break
            for failure in failures[:len(failures) if choice[0] else 0]:
                _warn(f"BackupAndRestore skipped a backup that does not load ({failure})")
            if failures and choice[0] is None:
                error = "\n  ".join(failures)
        outcome = (choice, error)
        if basics.size() > 1:
            # Every rank learns the outcome, so a failed restore is an error
            # everywhere instead of ranks waiting for a broadcast that never comes.
            outcome = broadcast_object(outcome, self.root_rank, name="backup_and_restore.choice")
        if outcome[1] is not None:
            raise RuntimeError(f"keras_ddl: BackupAndRestore found backups in {self.backup_dir} "
                               f"but none loads (read on rank {self.root_rank}, raised on rank "
                               f"{basics.rank()}):\n  {outcome[1]}")
        return outcome[0]

    # ------------------------------------------------------------ restore

    def _check_matches(self, meta, variables):
        saved = meta["variables"]
        if len(saved) != len(variables):
            raise ValueError(f"the backup holds {len(saved)} variables, the model and optimizer "
                             f"{len(variables)} (a different model or optimizer?)")
        for i, (entry, variable) in enumerate(zip(saved, variables)):
            if list(entry["shape"]) != list(variable.shape) or \
                    entry["dtype"] != np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype).name:
                raise ValueError(f"variable {i} of the backup, {entry['path']} "
                                 f"{entry['dtype']}{entry['shape']}, does not match the model's "
                                 f"{variable.path} {variable.dtype}{list(variable.shape)}")

    def _load_shared(self, path, meta, variables):
        """root_rank: assigns the backup's shared variables (raises if they
        do not match the model), and Keras' global seed generator's state
        if the backup holds it (the generator is made on first use, maybe
        after this restore: it is not one of the matched variables)."""
        saved = backup_store.read_variables(path, meta)
        generator = [s for s in saved if s[0] == _GLOBAL_SEED_PATH]
        saved = [s for s in saved if s[0] != _GLOBAL_SEED_PATH]
        meta = dict(meta, variables=[v for v in meta["variables"]
                                     if v["path"] != _GLOBAL_SEED_PATH])
        self._check_matches(meta, variables)
        if generator:
            from keras.src.random.seed_generator import global_seed_generator
            variables = variables + [global_seed_generator().state]
            saved = saved + generator
        for (_, dtype, shape, raw), variable in zip(saved, variables):
            variable.assign(raw.view(np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype))
                            .reshape(shape))

    def _apply_own(self, blob):
        """Assigns this rank's own variables from its blob; returns the
        tf.data iterator files it holds, or None. The metrics' values are
        assigned when the resumed epoch begins (fit resets them first)."""
        arrays = backup_store.read_npz_bytes(blob)
        own = self._own_variables()
        values = [arrays.get(f"own_{i}") for i in range(len(own))]
        if any(v is None or list(v.shape) != list(var.shape) for v, var in zip(values, own)) \
                or len(arrays) - sum(k.startswith("iterator_") for k in arrays) != len(own):
            _warn("BackupAndRestore: the backup's non-trainable and metric variables do not "
                  "match this model's; they keep the values root_rank restored")
            self._metric_values = None
        else:
            model_part = len(self.model.non_trainable_variables)
            for variable, value in zip(own[:model_part], values[:model_part]):
                variable.assign(value)
            self._metric_values = values[model_part:]
        files = {k[len("iterator_"):]: v.tobytes() for k, v in arrays.items()
                 if k.startswith("iterator_")}
        return files or None

    def on_train_begin(self, logs=None):
        if not self.model.built:
            raise ValueError("keras_ddl: BackupAndRestore needs a built model (give it an "
                             "Input, or call it on a batch, before fit)")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        strategy = self.model.distribute_strategy
        from .strategy import DDLStrategy
        self._strategy_shards = isinstance(strategy, DDLStrategy) and basics.size() > 1
        path, meta = self._chosen if self._chosen is not None else self._choose()
        self._chosen = None  # a later fit looks again
        seed = self._shuffle_seed(meta)
        self._input = fit_input.FitInput(fit_input.find_epoch_iterator(),
                                         self._positioned_by_script is not None, seed)
        self._global_batch = self._positioned_by_script or self.global_batch_size or \
            self._input.global_batch(self._strategy_shards)
        self._warn_unpositioned()
        if meta is None:
            self.position = TrainingPosition(world_size=basics.size(), shuffle_seed=seed,
                                             global_batch=self._global_batch,
                                             input=self._input.kind)
        else:
            self._restore(path, meta)
        self.restored_epoch = self.position.epoch
        # ddlrun measures what a fault cost from these (launcher_progress.py).
        self._iterations = self.position.iterations or 0
        if self._is_root():
            launcher_progress.report("resumed", self._iterations)
        self._epoch = self.position.epoch
        self._step = self.position.step
        self._since_save = 0
        self._iterator_unsavable = False
        if self.position.epoch > 0 or self.position.step > 0:
            # Keras' own BackupAndRestore resumes the same way: fit reads this
            # attribute after on_train_begin.
            private_api.set_initial_epoch(self.model, self.position.epoch)

    def _shuffle_seed(self, meta):
        if meta is not None:
            return int(meta["position"]["shuffle_seed"])
        # A fresh run: root's draw from numpy's generator, so that
        # keras.utils.set_random_seed makes fresh runs repeat.
        seed = int(np.random.randint(0, 2 ** 31 - 1))
        if basics.size() > 1:
            seed = int(broadcast(tf.constant([seed], tf.int64), self.root_rank,
                                 name="backup_and_restore.seed").numpy()[0])
        return seed

    def _restore(self, path, meta):
        shared = self._shared_variables()
        error = None
        if self._is_root():
            try:
                self._load_shared(path, meta, shared)
            except Exception as e:
                error = f"{path}: {type(e).__name__}: {e}"
        if basics.size() > 1:
            error = broadcast_object(error, self.root_rank, name="backup_and_restore.loaded")
        if error is not None:
            raise RuntimeError(f"keras_ddl: BackupAndRestore could not load the backup {error} "
                               f"(rank {self.root_rank})")
        if basics.size() > 1:
            if any(v["path"] == _GLOBAL_SEED_PATH for v in meta["variables"]):
                from keras.src.random.seed_generator import global_seed_generator
                shared = shared + [global_seed_generator().state]
            broadcast_variables(shared, root_rank=self.root_rank)
        position = TrainingPosition(**meta["position"])
        same_size = position.world_size == basics.size()
        blobs = None
        if self._is_root():
            names = [backup_store.rank_file(r if same_size else meta["root_rank"])
                     for r in range(basics.size())]
            blobs = [open(os.path.join(path, n), "rb").read() for n in names]
        self._input.build_metrics(self.model)
        files = self._apply_own(_scatter_from_root(blobs, self.root_rank))
        self.position = position
        self._report_resume(position, same_size)
        step = position.step
        if self._input.kind == fit_input.TF_DATA and not same_size:
            step = self._restart_epoch(position, f"a tf.data pipeline's iterator state is its "
                                       f"rank's share at {position.world_size} ranks")
            files = None
        elif self._input.kind == fit_input.TF_DATA and position.input != fit_input.TF_DATA:
            step = self._restart_epoch(position, "the backup holds no iterator state of this "
                                       "tf.data pipeline")
            files = None
        elif self._input.kind == fit_input.ARRAYS and not same_size and \
                not self._strategy_shards:
            step = self._restart_epoch(position, "the arrays are this rank's share (no "
                                       "DDLStrategy), made for the old world size")
        elif self._input.kind == fit_input.OTHER:
            step = self._restart_epoch(position, f"the input ({self._input.why_not}) cannot be "
                                       "positioned")
        self._input.resume(position.epoch, step,
                           files if self._input.kind == fit_input.TF_DATA else None,
                           meta.get("iterator_epoch"))
        if step != position.step:
            self.position = dataclasses.replace(position, step=step)

    def _restart_epoch(self, position, why):
        if position.step:
            _warn(f"BackupAndRestore: {why}; epoch {position.epoch} starts over at its first "
                  f"batch from the state after its batch {position.step} (those "
                  f"{position.step} batches are trained again). An input built with "
                  "keras_ddl.data.sample_index_dataset(..., backup=...) resumes at its batch")
        return 0

    def _report_resume(self, position, same_size):
        if not self._is_root():
            return
        samples = "" if position.samples is None else f" ({position.samples} global samples)"
        _warn(f"BackupAndRestore resumes at epoch {position.epoch} batch {position.step}"
              f"{samples}, optimizer step {position.iterations}, written by "
              f"{position.world_size} rank(s), on {basics.size()} rank(s)")
        if not same_size and position.global_batch:
            from .data import warn_uneven_global_batch
            warn_uneven_global_batch(position.global_batch, basics.size(),
                                     f" (the backup's, written by {position.world_size} ranks)")

    def _warn_unpositioned(self):
        if not self._is_root():
            return
        if self._input.kind == fit_input.OTHER and self.save_freq != "epoch":
            _warn(f"BackupAndRestore: the input ({self._input.why_not}) cannot be positioned: a "
                  "run resumed from a backup taken within an epoch starts that epoch at its "
                  "first batch (give arrays, a tf.data pipeline, or "
                  "keras_ddl.data.sample_index_dataset)")
        if self._input.reshuffles_ahead:
            _warn("BackupAndRestore: this tf.data pipeline maps in parallel after a batch, over a "
                  "shuffle that reshuffles each epoch; TensorFlow restores such an iterator with "
                  "the reshuffling one epoch ahead, so after a resume the epochs that follow the "
                  "resumed one are shuffled differently from an uninterrupted run (the resumed "
                  "epoch is exact). Map before batching, or without num_parallel_calls, to "
                  "resume bitwise")

    def on_train_end(self, logs=None):
        try:
            if self.save_freq != "epoch" and self._since_save:
                self._save(self._epoch, self._step)
            self._writer.wait()
        finally:
            # A later fit on this model starts where its caller says again.
            private_api.set_initial_epoch(self.model, None)

    # ------------------------------------------------------------ save

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._input.begin_epoch(epoch)
        metrics, self._metric_values = self._metric_values, None
        if metrics is not None and self.position.step and epoch == self.position.epoch:
            # The resumed epoch's metrics go on from the backup's running state.
            for variable, value in zip(self.model.metrics_variables, metrics):
                variable.assign(value)

    def on_train_batch_begin(self, batch, logs=None):
        if self.save_freq != "epoch" and self._since_save >= self.save_freq:
            self._save(self._epoch, batch)
        per_call = int(getattr(self.model, "steps_per_execution", 1) or 1)
        self._since_save += per_call
        self._input.batches_done += per_call
        self._step = batch + per_call

    def on_train_batch_end(self, batch, logs=None):
        self._iterations += int(getattr(self.model, "steps_per_execution", 1) or 1)
        if self._is_root():
            launcher_progress.report("step", self._iterations)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._step = epoch + 1, 0
        if self.save_freq == "epoch":
            self._save(epoch + 1, 0)

    def _rank_state(self):
        """This rank's own state as the bytes of an .npz."""
        own = [tf.identity(v.value) for v in self._own_variables()]
        arrays = {f"own_{i}": np.asarray(t) for i, t in enumerate(own)}
        kind = self._input.kind
        if kind == fit_input.TF_DATA and not self._iterator_unsavable:
            try:
                files = self._input.iterator_state()
                for name, data in files.items():
                    arrays[f"iterator_{name}"] = np.frombuffer(data, np.uint8)
                if not files:  # before the first step: nothing to restore into
                    kind = fit_input.OTHER
            except Exception as e:
                self._iterator_unsavable = True  # not tried again in this fit
                _warn(f"BackupAndRestore: TensorFlow cannot save this tf.data pipeline's "
                      f"iterator ({type(e).__name__}: {str(e).splitlines()[0][:200]}); a "
                      "run resumed from a backup taken within an epoch starts that epoch "
                      "at its first batch")
        if kind == fit_input.TF_DATA and self._iterator_unsavable:
            kind = fit_input.OTHER
        return backup_store.npz_bytes(arrays), kind

    def _save(self, epoch, step):
        """Backs up the state after `step` batches of epoch `epoch` (every
        rank calls it at the same point)."""
        optimizer = getattr(self.model, "optimizer", None)
        iterations = int(optimizer.iterations.numpy()) if optimizer is not None else 0
        blob, kind = self._rank_state()
        blobs = _gather_to_root(blob, self.root_rank)
        kinds = _gather_to_root(kind.encode(), self.root_rank)
        self._since_save = 0
        if not self._is_root():
            return
        # The input's position is kept only if every rank kept its own.
        kind = kinds[0].decode() if len(set(kinds)) == 1 else fit_input.OTHER
        position = TrainingPosition(epoch=epoch, step=step, global_batch=self._global_batch,
                                    iterations=iterations, world_size=basics.size(),
                                    shuffle_seed=self._input.shuffle_seed, input=kind)
        # Snapshots (reads: an update after them copies the variable's buffer
        # first), made into numpy arrays by the writer.
        arrays = [(v.path, tf.identity(v.value)) for v in self._shared_variables()]
        generator = _global_seed_generator()
        if generator is not None:
            arrays.append((_GLOBAL_SEED_PATH, tf.identity(generator.state.value)))
        meta = {"position": dataclasses.asdict(position), "root_rank": self.root_rank,
                "iterator_epoch": self._input.current_epoch, "keras": keras.__version__,
                "time": time.time()}
        job = functools.partial(self._write, position, meta, arrays, dict(enumerate(blobs)))
        if self.background:
            self._writer.submit(job)
        else:
            job()

    def _write(self, position, meta, arrays, blobs):
        what = f"epoch {position.epoch}" + (f" batch {position.step}" if position.step else "")
        os.makedirs(self.backup_dir, exist_ok=True)
        backup_store.remove_partials(self.backup_dir, lambda p: _warn(
            f"BackupAndRestore removes {p}, left by an interrupted save"))
        try:
            final = backup_store.write_backup(
                self.backup_dir, backup_store.backup_name(position.epoch, position.step),
                meta, arrays, blobs)
        except OSError as e:  # a full disk, a quota, a lost mount
            kept = self.backups()
            previous = (f"the previous backup {kept[-1][1]} is intact" if kept
                        else "there is no earlier backup")
            raise OSError(e.errno, f"keras_ddl: BackupAndRestore could not write the backup of "
                                   f"{what} in {self.backup_dir} on rank {basics.rank()}: "
                                   f"{e.strerror or e}; {previous}") from e
        backup_store.prune(self.backup_dir, self.keep)
        launcher_progress.report("backup", position.iterations)
        return final

    def save(self, epoch, step=0):
        """Writes the backup of the state now as that of `step` batches of
        epoch `epoch` (call on every rank, as a collective) and waits for it."""
        self._save(epoch, step)
        return self._writer.wait() if self._is_root() else None
