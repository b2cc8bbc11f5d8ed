"""A training script written for Horovod's Keras API (the shape of Horovod's
tensorflow2_keras_mnist example), running on keras_ddl. The only line that
differs from the Horovod original is the import:

    import horovod.tensorflow.keras as hvd          # Horovod
    import keras_ddl.horovod.tensorflow.keras as hvd  # keras_ddl

    mpiexec -n 2 python examples/horovod_keras_mnist_style.py OUT_DIR

Small synthetic MNIST-like data (8x8 images, 10 classes), no download.
examples/ddl_keras_mnist_style.py is the same training on keras_ddl's own
API; tests/test_horovod_mpi.py checks that both end with the same weights.
Rank 0 writes OUT_DIR/checkpoint-{epoch}.weights.h5, and the initial and
final weights as .npz.
"""

import os
import sys

import keras
import numpy as np

import keras_ddl.horovod.tensorflow.keras as hvd

hvd.init()
out_dir = sys.argv[1] if len(sys.argv) > 1 else "horovod_mnist_style_out"
if hvd.rank() == 0:
    os.makedirs(out_dir, exist_ok=True)

# The same data on every rank, each training on its own shard.
rng = np.random.default_rng(1234)
labels = rng.integers(0, 10, 512)
images = rng.normal(0.0, 0.5, (512, 8, 8, 1)).astype("float32")
images[np.arange(512), labels % 8, 2 + labels // 8, 0] += 3.0  # a bright pixel per class
x_train, y_train = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]

keras.utils.set_random_seed(hvd.rank())  # different initial weights: the broadcast fixes them
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(10, activation="softmax"),
])

# Horovod: scale the learning rate by the number of workers.
scaled_lr = 0.002 * hvd.size()
opt = keras.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1,
                               average_aggregated_gradients=True)
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first epoch.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(
        os.path.join(out_dir, "checkpoint-{epoch}.weights.h5"), save_weights_only=True))
    np.savez(os.path.join(out_dir, "initial_weights.npz"), *model.get_weights())

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0
model.fit(x_train, y_train, batch_size=16, callbacks=callbacks, epochs=2, verbose=verbose)

if hvd.rank() == 0:
    np.savez(os.path.join(out_dir, "final_weights.npz"), *model.get_weights())
