"""Horovod 0.28's tf.keras MNIST example (examples/tensorflow2/tensorflow2_keras_mnist.py
in the Horovod repository), ported to keras_ddl and Keras 3.

    mpiexec -n 2 python examples/horovod_keras_mnist_style.py OUT_DIR
    ddlrun -np 2 python examples/horovod_keras_mnist_style.py OUT_DIR

Every line of train() below is Horovod's, in Horovod's order, except these (the
porting guide, docs/horovod_porting.md, walks through each):

1. The import: ``import horovod.tensorflow.keras as hvd`` became
   ``import keras_ddl.horovod.tensorflow.keras as hvd``. Needed.
2. ``compile(..., experimental_run_tf_function=False)`` became
   ``compile(..., jit_compile=False)``: Keras 3's compile() raises TypeError on
   the old argument, and its default ``jit_compile="auto"`` compiles the train
   step with XLA whenever a GPU is present, where keras_ddl's collectives (custom
   TensorFlow ops without XLA kernels) cannot run. Needed (the second part on GPUs).
3. The data: Horovod downloads MNIST (``tf.keras.datasets.mnist.load_data``)
   and feeds an endless shuffled ``tf.data`` pipeline with
   ``steps_per_epoch=500 // hvd.size()``; here 512 generated 8x8 images, each
   rank fitting its own shard as numpy arrays (no download, and deterministic,
   so tests/mpi/test_horovod_mpi.py can compare weights bitwise). Not a porting change.
4. The model: two small layers instead of Horovod's 32/64-filter convolutions
   with dropout, 2 epochs instead of 24, batch 16 instead of 128, base rate
   0.002 instead of 0.001, 1 warmup epoch instead of 3: to train in seconds on
   CPUs. Not a porting change.
5. The checkpoint: ``ModelCheckpoint('./checkpoint-{epoch}.h5')`` became
   ``OUT_DIR/checkpoint-{epoch}.weights.h5`` with ``save_weights_only=True``
   (Keras 3 still writes a whole model to ``.h5``, as a legacy format; weights
   files must end in ``.weights.h5``), and rank 0 also saves the initial and
   final weights as .npz for the test. Not needed for Keras 3.
6. The entry point: OUT_DIR comes from argparse (so --help works), and the
   ``horovod.run(train, np=..., hosts=...)`` branch is gone: launch with
   mpiexec, ddlrun or srun instead of horovodrun or horovod.run.

What did not change, and still works under Keras 3 with TensorFlow 2.16+:
``tf.keras.*`` (it is Keras 3), ``tf.optimizers.Adam``,
``tf.losses.SparseCategoricalCrossentropy``, ``hvd.DistributedOptimizer(opt,
backward_passes_per_step=1, average_aggregated_gradients=True)``, the three
Horovod callbacks, rank-0 checkpoints and logs, and Horovod's GPU-pinning lines
(``ddl.init()`` already pins one GPU per local rank; these lines then agree with
it). examples/ddl_keras_mnist_style.py is the same training on keras_ddl's own
API; tests/mpi/test_horovod_mpi.py checks that both end with the same weights.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

import keras_ddl.horovod.tensorflow.keras as hvd  # Horovod: import horovod.tensorflow.keras as hvd


def synthetic_mnist(rank, size):
    """512 8x8 images of 10 classes (a bright pixel per class in noise);
    this rank's shard. The same on every rank before sharding."""
    rng = np.random.default_rng(1234)
    labels = rng.integers(0, 10, 512)
    images = rng.normal(0.0, 0.5, (512, 8, 8, 1)).astype("float32")
    images[np.arange(512), labels % 8, 2 + labels // 8, 0] += 3.0
    return images[rank::size], labels[rank::size]


def train(out_dir):
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    if hvd.rank() == 0:
        os.makedirs(out_dir, exist_ok=True)
    x_train, y_train = synthetic_mnist(hvd.rank(), hvd.size())

    tf.keras.utils.set_random_seed(hvd.rank())  # different weights: the broadcast fixes them
    mnist_model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(8, [3, 3], activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.002 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    # keras_ddl: the collectives are custom ops without XLA kernels; Keras 3 would
    # compile the step with XLA on a GPU.
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'],
                        jit_compile=False)

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),

        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),

        # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
        # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
        # the first epoch. See https://arxiv.org/abs/1706.02677 for details.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
    ]

    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, 'checkpoint-{epoch}.weights.h5'), save_weights_only=True))
        np.savez(os.path.join(out_dir, 'initial_weights.npz'), *mnist_model.get_weights())

    # Horovod: write logs on worker 0.
    verbose = 1 if hvd.rank() == 0 else 0

    # Train the model.
    mnist_model.fit(x_train, y_train, batch_size=16, callbacks=callbacks, epochs=2,
                    verbose=verbose)

    if hvd.rank() == 0:
        np.savez(os.path.join(out_dir, 'final_weights.npz'), *mnist_model.get_weights())

    # Return the model
    return mnist_model


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out_dir', nargs='?', default='horovod_mnist_style_out',
                        help='directory where rank 0 writes checkpoint-{epoch}.weights.h5 and '
                        'the initial and final weights (default: horovod_mnist_style_out)')
    train(parser.parse_args().out_dir)
