"""What ``BackupAndRestore(save_freq=N)`` costs a training step, with ResNet-50's state.

    python -m keras_ddl.bench backup                 # one process, 3 repetitions
    python -m keras_ddl_tools.results run --name backup_resnet50 --launches 5 \
        --conditions "..." -- python -m keras_ddl.bench backup --image-size 64

One process trains Keras' ResNet-50 (25.6 M parameters, 1000 classes; with
SGD momentum and BatchNorm the backed-up state is about 205 MB) on a
repeated synthetic batch (``--batch`` images of ``--image-size``). A
repetition is three ``fit`` calls of ``--steps`` steps on the same model,
in turn: no backup, ``BackupAndRestore(save_freq=--save-freq,
background=False)`` (the variables are written before training goes on)
and ``background=True`` (copied, then written by a thread while training
goes on). A step's time is the interval between consecutive
``on_train_batch_begin`` calls, where the backup is taken, so a step that
saves includes its save; the first step of each fit is left out.

Columns, per kind of backup (``method``), medians over the repetitions:

- ``step_s``: median step time without backups (the baseline).
- ``save_s``: what one backup adds to the fit: (sum of step times with
  backups - sum without) / backups taken, so it holds the training
  thread's wait and, in the background, the write's competition for the
  CPU and the disk with the steps that overlap it.
- ``blocked_s``: the time the training thread spends in the save call
  (copying the variables, and waiting for the previous write in the
  background).
- ``write_s``: the time one backup's files take to write and fsync.
- ``per_step@N``: ``save_s / (N * step_s)``, the fraction of training time
  backups take at ``save_freq = N``, for N = 10 (measured: the fits save
  every ``--save-freq`` steps, 10 by default) and N = 100 and 1000 (from the
  same per-save cost; in the background valid while ``write_s`` is below N
  steps, which the table shows).
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from .common import print_table

ROUNDS_AT = (10, 100, 1000)


def _model(keras, image_size):
    model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                        classes=1000, classifier_activation=None)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _Timer:
    """Stamps every on_train_batch_begin; placed before the backup callback,
    so that a step's interval holds the save taken at its start."""

    def __init__(self, keras):
        class Stamps(keras.callbacks.Callback):
            def on_train_begin(cb, logs=None):
                cb.stamps = []

            def on_train_batch_begin(cb, batch, logs=None):
                cb.stamps.append(time.perf_counter())

            def on_train_end(cb, logs=None):
                cb.stamps.append(time.perf_counter())

        self.callback = Stamps()

    def steps(self):
        stamps = self.callback.stamps
        # The end stamp comes after on_train_end's final save: leave out the
        # last interval with the first.
        return np.diff(stamps[:-1])[1:]


def _instrument(backup):
    """Records how long the training thread spends in each save, and each
    write (in whichever thread runs it)."""
    blocked, writes = [], []
    save, write = backup._save, backup._write

    def timed_save(*args):
        start = time.perf_counter()
        try:
            return save(*args)
        finally:
            blocked.append(time.perf_counter() - start)

    def timed_write(*args):
        start = time.perf_counter()
        result = write(*args)
        writes.append(time.perf_counter() - start)
        return result

    backup._save, backup._write = timed_save, timed_write
    return blocked, writes


def _state_bytes(model):
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
               for v in model.variables + model.optimizer.variables)


def run(args):
    import tensorflow as tf
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    import keras_ddl as ddl

    ddl.init()
    keras.utils.set_random_seed(0)
    model = _model(keras, args.image_size)
    images = tf.random.stateless_normal([args.batch, args.image_size, args.image_size, 3],
                                        seed=[1, 2])
    labels = tf.random.stateless_uniform([args.batch], [3, 4], 0, 1000, tf.int32)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    root = args.dir or tempfile.mkdtemp(prefix="keras_ddl-bench-backup-")
    os.makedirs(root, exist_ok=True)
    kinds = ("none", "sync", "background")
    runs = {k: [] for k in kinds}
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)  # trace once
    for rep in range(args.reps):
        for kind in kinds:
            directory = os.path.join(root, f"{kind}-{rep}")
            timer = _Timer(keras)
            callbacks = [timer.callback]
            blocked = writes = []
            if kind != "none":
                backup = ddl.callbacks.BackupAndRestore(
                    directory, save_freq=args.save_freq, keep=1,
                    background=kind == "background")
                blocked, writes = _instrument(backup)
                callbacks.append(backup)
            model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0,
                      callbacks=callbacks)
            steps = timer.steps()
            # Saves at the start of a counted step (the final save of fit's
            # end is not in a step interval).
            saves = sum(1 for b in range(1, args.steps) if b % args.save_freq == 0
                        and b + 1 < args.steps)
            runs[kind].append({"total": float(np.sum(steps)), "median": float(np.median(steps)),
                               "saves": saves, "blocked": list(blocked[:saves]),
                               "writes": list(writes)})
            shutil.rmtree(directory, ignore_errors=True)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return summarize(runs, args, _state_bytes(model))


def summarize(runs, args, state_bytes):
    """One row per kind of backup, from the repetitions of one launch."""
    step = statistics.median(r["median"] for r in runs["none"])
    rows = []
    for kind in ("sync", "background"):
        costs = [(r["total"] - base["total"]) / r["saves"]
                 for r, base in zip(runs[kind], runs["none"]) if r["saves"]]
        save = statistics.median(costs)
        blocked = [b for r in runs[kind] for b in r["blocked"]]
        writes = [w for r in runs[kind] for w in r["writes"]]
        row = {"method": kind, "state_MB": round(state_bytes / 1e6, 1), "step_s": step,
               "save_s": save, "blocked_s": statistics.median(blocked),
               "write_s": statistics.median(writes)}
        for n in ROUNDS_AT:
            row[f"per_step@{n}"] = save / (n * step)
        rows.append(row)
    return rows


COLUMNS = ["method", "state_MB", "step_s", "save_s", "blocked_s", "write_s",
           "per_step@10", "per_step@100", "per_step@1000"]


def main(args):
    rows = run(args)
    print_table(f"BackupAndRestore cost, ResNet-50 state, batch {args.batch} x "
                f"{args.image_size}px, save every {args.save_freq} of {args.steps} steps, "
                f"{args.reps} repetitions", COLUMNS, rows)
    if args.json:
        from keras_ddl_tools.results import write_json
        write_json(args.json, {"backup_cost": rows, "config": {
            k: getattr(args, k) for k in ("batch", "image_size", "steps", "save_freq", "reps",
                                          "threads")}})
    return rows
