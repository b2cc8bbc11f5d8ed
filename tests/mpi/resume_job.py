"""A short DDLStrategy fit with ddl.callbacks.BackupAndRestore, for tests/test_resume_mpi.py.

    resume_job.py MODE BACKUP_DIR

full       train EPOCHS epochs (restoring from BACKUP_DIR if it holds backups)
kill       as full, but rank 1 kills itself (SIGKILL) mid-way through epoch 2
killsave   as full, but rank 0 is killed while writing its first backup,
           after half of the weights file is on disk
killonce   as kill, in the first attempt of ddlrun --max-restarts only
           (DDLRUN_RESTART_COUNT=0): the restarted job trains to the end

Every rank prints ``RESTORED epoch=E iterations=I`` after fit's restore and,
at the end, ``FINAL digest=D iterations=I`` (D: SHA-256 of all weights and
optimizer variables). Rank 0 also saves them to BACKUP_DIR/../MODE.final.npz.
"""

import hashlib
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import keras_ddl as ddl  # noqa: E402

EPOCHS, STEPS, BATCH = 3, 4, 8
mode, backup_dir = sys.argv[1], sys.argv[2]
ddl.init()
rank = ddl.rank()


def say(text):
    sys.stdout.write(f"RANK {rank} {text}\n")
    sys.stdout.flush()


# Ranks seed differently: the strategy must start every rank from rank 0's weights.
keras.utils.set_random_seed(100 + rank)
rng = np.random.default_rng(rank)
x = rng.normal(size=(STEPS * BATCH, 6)).astype(np.float32)
y = rng.integers(0, 3, STEPS * BATCH)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
# Finite, no shuffle: every epoch sees the same batches, in whichever run it happens.
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).with_options(options)

strategy = ddl.DDLStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    schedule = ddl.schedules.WarmUp(
        keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.7),
        warmup_steps=3, initial_learning_rate=0.01)
    model.compile(keras.optimizers.SGD(schedule, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Faults(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        say(f"RESTORED epoch={backup.restored_epoch} "
            f"iterations={int(model.optimizer.iterations.numpy())}")

    def on_train_batch_begin(self, batch, logs=None):
        first_attempt = os.environ.get("DDLRUN_RESTART_COUNT") == "0"
        if (mode == "kill" or mode == "killonce" and first_attempt) and rank == 1 and \
                self.epoch == 1 and batch == 2:
            say(f"killed at {time.time():.3f}")
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


if mode == "killsave" and rank == 0:
    real_save_weights = keras.Model.save_weights

    def save_weights_then_die(self, filepath, *args, **kwargs):
        real_save_weights(self, filepath, *args, **kwargs)
        with open(filepath, "r+b") as f:  # half the bytes reached the disk
            f.truncate(os.path.getsize(filepath) // 2)
        say("killed while saving")
        os.kill(os.getpid(), signal.SIGKILL)

    keras.Model.save_weights = save_weights_then_die

backup = ddl.callbacks.BackupAndRestore(backup_dir)
# BackupAndRestore goes first: the other callbacks see the restored state.
model.fit(data, epochs=EPOCHS, callbacks=[backup, Faults()], verbose=0)

state = [v.numpy() for v in model.variables + model.optimizer.variables]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in state)).hexdigest()
say(f"FINAL digest={digest} iterations={int(model.optimizer.iterations.numpy())}")
if rank == 0:
    np.savez(os.path.join(os.path.dirname(os.path.abspath(backup_dir)), f"{mode}.final.npz"),
             *state)
ddl.shutdown()
