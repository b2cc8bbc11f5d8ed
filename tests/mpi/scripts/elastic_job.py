"""A small Keras fit that backs up every SAVE_FREQ steps and resumes at any
world size, for tests/cluster/test_elastic_cluster.py (under ddlrun --min-np on the
test cluster) and docs/scripts/fault_soak.py.

    elastic_job.py WORK_DIR [SEED [EPOCHS]]

The data set is N_SAMPLES fixed samples; every epoch takes them in an order that
depends on (SEED, epoch) only, in steps of GLOBAL_BATCH samples split over
the ranks (keras_ddl.data.sample_index_dataset), so a run resumed from a
backup at another world size goes on with the samples its epoch has not
seen. Backups go to WORK_DIR/backup (every one kept).

Every rank appends, after each step it trained, ``attempt epoch step ids...``
to WORK_DIR/samples-a<attempt>-r<rank>.txt (step: optimizer steps done,
counted from the start; ids: the samples of that step on this rank). Rank 0
prints ``STEP s`` after each step, ``RESUMED step=S size=W attempt=A`` when
fit starts, and at the end ``FINAL loss=L`` (the loss over the whole data
set) and saves the weights and optimizer state to WORK_DIR/final.npz. In an
attempt after the first (a restart), rank 0 also copies the backup
directory it resumed from to WORK_DIR/resumed-backup before training.
"""

import os
import shutil
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import keras_ddl as ddl  # noqa: E402

N_SAMPLES, GLOBAL_BATCH, SAVE_FREQ = 48, 6, 2
STEPS_PER_EPOCH = N_SAMPLES // GLOBAL_BATCH
STEP_SLEEP_S = 0.15  # slow enough for a fault to land mid-epoch
work = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
attempt = int(os.environ.get("DDLRUN_RESTART_COUNT", "0"))
backup_dir = os.path.join(work, "backup")
ddl.init()
rank, size = ddl.rank(), ddl.size()

data_rng = np.random.default_rng(0)  # SEED varies the initial weights and the order
x = data_rng.normal(size=(N_SAMPLES, 6)).astype(np.float32)
y = data_rng.integers(0, 3, N_SAMPLES).astype(np.int64)
# Column 0 carries the sample's id through the input; the model drops it.
x_with_ids = np.concatenate([np.arange(N_SAMPLES, dtype=np.float32)[:, None], x], axis=1)
keras.utils.set_random_seed(seed * 100 + rank)  # rank 0's initial weights are broadcast


class SampleLog(keras.Model):
    """Writes the ids of every step it trained to this rank's log."""

    def train_step(self, data):
        logs = super().train_step(data)
        step = int(self.optimizer.iterations.numpy())
        ids = " ".join(str(int(i)) for i in data[0][:, 0].numpy())
        with open(os.path.join(work, f"samples-a{attempt}-r{rank}.txt"), "a") as f:
            f.write(f"{attempt} {(step - 1) // STEPS_PER_EPOCH} {step} {ids}\n")
        return logs


class Pace(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        done = int(self.model.optimizer.iterations.numpy())
        if rank == 0:
            print(f"RESUMED step={done} size={size} attempt={attempt}", flush=True)
            if attempt > 0:
                shutil.copytree(backup_dir, os.path.join(work, "resumed-backup"),
                                dirs_exist_ok=True)

    def on_train_batch_end(self, batch, logs=None):
        if rank == 0:
            print(f"STEP {int(self.model.optimizer.iterations.numpy())}", flush=True)
        time.sleep(STEP_SLEEP_S)


backup = ddl.callbacks.BackupAndRestore(backup_dir, save_freq=SAVE_FREQ, keep=1000)
table_x, table_y = tf.constant(x_with_ids), tf.constant(y)
samples = ddl.data.sample_index_dataset(N_SAMPLES, GLOBAL_BATCH, seed=seed, backup=backup)
inputs = samples.map(lambda i: (tf.gather(table_x, i), tf.gather(table_y, i)))

strategy = ddl.DDLStrategy()
with strategy.scope():
    features = keras.Input((7,))
    hidden = keras.layers.Lambda(lambda t: t[:, 1:])(features)
    hidden = keras.layers.Dense(8, activation="relu")(hidden)
    model = SampleLog(features, keras.layers.Dense(3)(hidden))
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)  # train_step sees each step's ids

model.fit(inputs, epochs=epochs, steps_per_epoch=STEPS_PER_EPOCH, verbose=0, shuffle=False,
          callbacks=[backup, Pace()])
if rank == 0:
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x_with_ids))
    print(f"FINAL loss={float(loss):.9g}", flush=True)
    np.savez(os.path.join(work, "final.npz"),
             *[v.numpy() for v in model.variables + model.optimizer.variables])
ddl.shutdown()
