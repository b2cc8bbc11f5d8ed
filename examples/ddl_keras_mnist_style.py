"""The training of examples/horovod_keras_mnist_style.py written on keras_ddl's
own API, for comparison (tests/mpi/test_horovod_mpi.py checks both end with the
same weights).

    mpiexec -n 2 python examples/ddl_keras_mnist_style.py OUT_DIR
"""

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("out_dir", nargs="?", default="ddl_mnist_style_out",
                    help="directory where rank 0 writes checkpoint-{epoch}.weights.h5 and the "
                    "initial and final weights (default: ddl_mnist_style_out)")
out_dir = parser.parse_args().out_dir  # before the imports: --help answers at once

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_ddl as ddl  # noqa: E402

ddl.init()
if ddl.rank() == 0:
    os.makedirs(out_dir, exist_ok=True)

rng = np.random.default_rng(1234)
labels = rng.integers(0, 10, 512)
images = rng.normal(0.0, 0.5, (512, 8, 8, 1)).astype("float32")
images[np.arange(512), labels % 8, 2 + labels // 8, 0] += 3.0  # a bright pixel per class
x_train, y_train = images[ddl.rank()::ddl.size()], labels[ddl.rank()::ddl.size()]

keras.utils.set_random_seed(ddl.rank())
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(10, activation="softmax"),
])

scaled_lr = ddl.schedules.linear_scaling_rule(0.002, ddl.size(), 1)
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(),
              optimizer=ddl.DistributedOptimizer(keras.optimizers.Adam(scaled_lr)),
              metrics=["accuracy"], jit_compile=False)

callbacks = [
    ddl.callbacks.BroadcastGlobalVariablesCallback(0),
    ddl.callbacks.MetricAverageCallback(),
    ddl.callbacks.LearningRateWarmupCallback(scaled_lr, warmup_epochs=1, verbose=1),
    ddl.callbacks.on_rank(0, keras.callbacks.ModelCheckpoint(
        os.path.join(out_dir, "checkpoint-{epoch}.weights.h5"), save_weights_only=True)),
]
if ddl.rank() == 0:
    np.savez(os.path.join(out_dir, "initial_weights.npz"), *model.get_weights())

model.fit(x_train, y_train, batch_size=16, callbacks=callbacks, epochs=2,
          verbose=1 if ddl.rank() == 0 else 0)

if ddl.rank() == 0:
    np.savez(os.path.join(out_dir, "final_weights.npz"), *model.get_weights())
