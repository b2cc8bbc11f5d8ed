"""The training job of docs/scripts/fault_soak.py: a small Keras model, fit
with DDLStrategy and BackupAndRestore, slow enough (a short sleep per step)
that faults can land anywhere in it.

    soak_train.py BACKUP_DIR EPOCHS RESULT.npz

Every rank prints ``SOAK START rank=R pid=P host=H attempt=A`` at start;
rank 0 prints ``SOAK EPOCH E attempt=A`` as each epoch begins and saves the
final weights and optimizer state to RESULT.npz.
"""

import os
import socket
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import keras_ddl as ddl  # noqa: E402

STEPS, BATCH, STEP_SLEEP_S = 5, 8, 0.15
backup_dir, epochs, result = sys.argv[1], int(sys.argv[2]), sys.argv[3]
attempt = os.environ.get("DDLRUN_RESTART_COUNT", "0")
ddl.init()
rank = ddl.rank()
print(f"SOAK START rank={rank} pid={os.getpid()} host={socket.gethostname()} "
      f"attempt={attempt}", flush=True)

keras.utils.set_random_seed(7 + rank)  # rank 0's initial weights are broadcast
rng = np.random.default_rng(rank)
x = rng.normal(size=(STEPS * BATCH, 12)).astype(np.float32)
y = rng.integers(0, 4, STEPS * BATCH)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).with_options(options)

strategy = ddl.DDLStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Pace(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if rank == 0:
            print(f"SOAK EPOCH {epoch} attempt={attempt}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(STEP_SLEEP_S)


model.fit(data, epochs=epochs, verbose=0,
          callbacks=[ddl.callbacks.BackupAndRestore(backup_dir), Pace()])
if rank == 0:
    np.savez(result, *[v.numpy() for v in model.variables + model.optimizer.variables])
    print("SOAK DONE", flush=True)
ddl.shutdown()
