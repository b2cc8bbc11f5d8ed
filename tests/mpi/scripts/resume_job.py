"""Short fits with ddl.callbacks.BackupAndRestore(save_freq=N), killed and
resumed, for tests/mpi/test_resume_mpi.py.

    resume_job.py WORKDIR PLAN [PLAN ...]

Runs the jobs of one plan, in order, in this process. Under ddlrun
``--max-restarts``, plan i is the one of attempt i (DDLRUN_RESTART_COUNT);
otherwise the first. A plan is jobs separated by ``+``; a job is
``KIND:NAME[:ACTION=BATCH]``:

KIND     arrays   numpy arrays given to fit under DDLStrategy (shuffle=True)
         tfdata   a tf.data pipeline reshuffled every epoch, under DDLStrategy
         script   keras_ddl.data.sample_index_dataset(backup=...) per rank,
                  DistributedOptimizer (no strategy), as a Horovod-style script
         copy     copies the backup directory NAME to ACTION (``copy:A:B``)
NAME     the backup directory WORKDIR/NAME of the job (and its logs' names)
ACTION   stop=B   raise in the middle of fit when global batch B starts (a
                  crash that leaves the process alive; the next job goes on)
         kill=B   rank 1 SIGKILLs itself when global batch B starts
                  (both once the backups due before are written)
         diewriting=B  rank 0 SIGKILLs itself in the middle of writing the
                  first backup due at global batch B or later
         again    fit twice: the second fit must train nothing
         hold=B   when global batch B starts (the backups due before on
                  disk), rank 0 creates WORKDIR/NAME.holding and every rank
                  waits there for good, for a test to cut a node or cancel
                  the job; only in a batch job's first run (a run that
                  Slurm requeued, SLURM_RESTART_COUNT >= 1, goes on)
         wait=B   the same in every run

Every job fits EPOCHS epochs of STEPS global batches of GLOBAL samples (54
samples, 6 batches of 9: uneven over 2 ranks) with Dropout, BatchNorm,
momentum and a warmup schedule, saving every SAVE_FREQ batches (never at an
epoch boundary). Each rank appends ``step id id ...`` for every step it
trains to WORKDIR/NAME.ids.<rank> (the sample ids of its rows), and prints
``RANK r JOB NAME RESTORED epoch=E step=S iterations=I world=W`` after the
restore, ``RANK r JOB NAME EPOCH e digest=D`` at the end of every epoch it
trains, and ``RANK r JOB NAME FINAL digest=D iterations=I`` at the end (D:
SHA-256 of every model and optimizer variable).
"""

import hashlib
import os
import shutil
import signal
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import keras_ddl as ddl  # noqa: E402
from keras_ddl.keras import backup_store  # noqa: E402

EPOCHS, STEPS, GLOBAL, SAVE_FREQ = 3, 6, 9, 5
SAMPLES, FEATURES = STEPS * GLOBAL, 4

ddl.init()
rank = ddl.rank()
workdir = sys.argv[1]
plans = sys.argv[2:]
plan = plans[min(int(os.environ.get("DDLRUN_RESTART_COUNT", "0")), len(plans) - 1)]


def say(text):
    sys.stdout.write(f"RANK {rank} {text}\n")
    sys.stdout.flush()


def dataset_arrays():
    """Column 0 is the sample id (the model logs it and drops it)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, FEATURES + 1)).astype(np.float32)
    x[:, 0] = np.arange(SAMPLES)
    y = rng.integers(0, 3, SAMPLES)
    return x, y


class LogIds(keras.layers.Layer):
    """Appends the step and the ids of this rank's rows to a file (flushed
    at once: a killed process leaves every line of the steps it ran), and
    passes the other columns on."""

    def __init__(self, path, read_step, **kwargs):
        super().__init__(**kwargs)
        self.log_path, self._read_step = path, read_step

    def _append(self, step, ids):
        with open(self.log_path, "a") as f:
            f.write(" ".join(str(int(v)) for v in [step.numpy()] + list(ids.numpy())) + "\n")
        return np.int64(0)

    def call(self, inputs, training=False):
        if training:
            done = tf.py_function(self._append, [self._read_step(), inputs[:, 0]], tf.int64)
            with tf.control_dependencies([done]):
                inputs = tf.identity(inputs)
        return inputs[:, 1:]


def build(kind, name):
    # Ranks seed differently: the start must be rank 0's everywhere.
    keras.utils.set_random_seed(100 + rank)
    holder = []
    inputs = keras.Input((FEATURES + 1,))
    h = LogIds(os.path.join(workdir, f"{name}.ids.{rank}"), lambda: holder[0].iterations)(inputs)
    h = keras.layers.Dense(16, activation="relu")(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Dropout(0.25)(h)
    model = keras.Model(inputs, keras.layers.Dense(3)(h))
    schedule = ddl.schedules.WarmUp(
        keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=4, decay_rate=0.8),
        warmup_steps=4, initial_learning_rate=0.01)
    optimizer = keras.optimizers.SGD(schedule, momentum=0.9)
    if kind == "script":
        optimizer = ddl.DistributedOptimizer(optimizer)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    holder.append(model.optimizer)
    return model


def fit_input(kind, backup):
    x, y = dataset_arrays()
    if kind == "arrays":
        return dict(x=x, y=y, batch_size=GLOBAL, shuffle=True)
    if kind == "tfdata":
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=5).batch(GLOBAL)
        return dict(x=ds)
    ds = ddl.data.sample_index_dataset(SAMPLES, GLOBAL, seed=11, backup=backup)
    ds = ds.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
    return dict(x=ds, steps_per_epoch=STEPS)


class Stop(Exception):
    pass


class Faults(keras.callbacks.Callback):
    def __init__(self, backup, name, action):
        super().__init__()
        self.backup, self.name = backup, name
        self.action, _, at = (action or "").partition("=")
        self.at = int(at) if at else None
        self.batches = 0

    def on_train_begin(self, logs=None):
        p = self.backup.position
        say(f"JOB {self.name} RESTORED epoch={p.epoch} step={p.step} "
            f"iterations={int(self.model.optimizer.iterations.numpy())} world={p.world_size}")
        if self.action == "diewriting" and rank == 0:
            real_write = backup_store._write
            job = self

            def write_then_die(path, chunks):
                # .../.partial-epoch-E[-step-S]-PID/variables.bin: the batch it backs up
                parts = os.path.basename(os.path.dirname(path)).split("-")
                at_batch = int(parts[2]) * STEPS + (int(parts[4]) if parts[3] == "step" else 0)
                if at_batch >= job.at and path.endswith(backup_store.VARIABLES):
                    chunks = list(chunks)
                    real_write(path, chunks[:len(chunks) // 2])  # half the bytes on disk
                    say(f"JOB {job.name} killed while saving")
                    os.kill(os.getpid(), signal.SIGKILL)
                return real_write(path, chunks)

            backup_store._write = write_then_die

    def on_epoch_end(self, epoch, logs=None):
        say(f"JOB {self.name} EPOCH {epoch} digest={digest(self.model)}")

    def on_train_batch_begin(self, batch, logs=None):
        first_run = int(os.environ.get("SLURM_RESTART_COUNT", "0")) == 0
        if self.batches == self.at and (self.action == "wait" or
                                        (self.action == "hold" and first_run)):
            self.backup._writer.wait()
            if rank == 0:
                open(os.path.join(workdir, f"{self.name}.holding"), "w").close()
            say(f"JOB {self.name} holding at batch {self.batches}")
            while True:
                time.sleep(1)
        if self.batches == self.at and self.action in ("stop", "kill"):
            # The fault lands once the last backup is on disk (a fault during
            # a write is the diewriting case).
            self.backup._writer.wait()
            if self.action == "stop":
                raise Stop()
            if rank == 1:
                say(f"JOB {self.name} killed at batch {self.batches}")
                os.kill(os.getpid(), signal.SIGKILL)
        self.batches += 1


def digest(model):
    state = [np.asarray(v.numpy()) for v in model.variables + model.optimizer.variables]
    return hashlib.sha256(b"".join(a.tobytes() for a in state)).hexdigest()


def run(kind, name, action):
    if kind == "copy":
        if rank == 0:
            shutil.copytree(os.path.join(workdir, name), os.path.join(workdir, action))
        ddl.barrier()
        return
    backup = ddl.callbacks.BackupAndRestore(os.path.join(workdir, name), save_freq=SAVE_FREQ)
    model = build(kind, name)
    data = fit_input(kind, backup)   # script: positioned from the backup
    callbacks = [backup]
    if kind == "script":
        callbacks += [ddl.callbacks.BroadcastGlobalVariablesCallback(0),
                      ddl.callbacks.MetricAverageCallback()]
    callbacks.append(Faults(backup, name, action))
    try:
        model.fit(**data, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    except Stop:
        say(f"JOB {name} stopped")
        return
    if action == "again":
        before = digest(model)
        again = ddl.callbacks.BackupAndRestore(os.path.join(workdir, name), save_freq=SAVE_FREQ)
        history = model.fit(**fit_input(kind, again), epochs=EPOCHS, callbacks=[again],
                            verbose=0)
        assert not history.history and digest(model) == before, "a finished run trained again"
    say(f"JOB {name} FINAL digest={digest(model)} "
        f"iterations={int(model.optimizer.iterations.numpy())}")


for job in plan.split("+"):
    kind, name, action = (job.split(":") + [None])[:3]
    if kind in ("arrays", "tfdata"):
        strategy = ddl.DDLStrategy()
        with strategy.scope():
            run(kind, name, action)
    else:
        run(kind, name, action)
ddl.shutdown()
