"""A one-minute tour of keras_ddl: a small CNN on generated images, on N processes.

    ddlrun -np 2 python examples/quickstart.py
    # or: mpiexec -n 2 python examples/quickstart.py ; or just: python examples/quickstart.py

The data set is generated (no download): 16x16 grey images of four classes
(horizontal bars, vertical bars, a diagonal, a centred square) with noise.
Every step of the usual recipe is here: init, shard the data by rank, scale
the learning rate with the global batch, wrap the optimizer, broadcast the
initial weights, average the logged metrics, save a checkpoint on rank 0
only, and evaluate over all ranks.
"""

import argparse
import os

import numpy as np


def make_data(n, seed):
    """n images (n, 16, 16, 1) float32 in [0, 1] and int labels in 0..3."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    images = rng.normal(0.0, 0.8, (n, 16, 16)).astype(np.float32)
    for i, c in enumerate(labels):
        k = rng.integers(2, 5)          # pattern period / size varies
        o = rng.integers(0, k)
        if c == 0:
            images[i, o::k, :] += 1.0
        elif c == 1:
            images[i, :, o::k] += 1.0
        elif c == 2:
            idx = np.arange(16)
            images[i, idx, (idx + o) % 16] += 1.5
        else:
            images[i, 8 - k:8 + k, 8 - k:8 + k] += 1.0
    return images[..., None], labels.astype(np.int32)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3, help="epochs to train (default: 3)")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch (default: 32)")
    p.add_argument("--train-size", type=int, default=4096,
                   help="generated training images, shared out over the ranks (default: 4096)")
    p.add_argument("--checkpoint", default="quickstart_model.keras",
                   help="where rank 0 saves the model after every epoch "
                   "(default: quickstart_model.keras)")
    args = p.parse_args()

    import keras
    import tensorflow as tf
    import keras_ddl as ddl

    # 1. Start the process group (implicit on first use; a plain `python`
    #    run is a world of size 1).
    ddl.init()
    rank, size = ddl.rank(), ddl.size()

    # 2. Every rank builds the same data set and keeps its own equal shard.
    x, y = make_data(args.train_size, seed=0)
    xv, yv = make_data(1024, seed=1)
    per = len(x) // size
    x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    per_v = len(xv) // size
    xv, yv = xv[rank * per_v:(rank + 1) * per_v], yv[rank * per_v:(rank + 1) * per_v]

    # 3. The global batch is batch_size * size: scale the learning rate.
    lr = ddl.schedules.linear_scaling_rule(0.05, args.batch_size * size,
                                           base_batch_size=args.batch_size)

    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast fixes it
    model = keras.Sequential([
        keras.Input((16, 16, 1)),
        keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(4),
    ])
    # 4. Wrap the optimizer: gradients are averaged over ranks each step.
    model.compile(optimizer=ddl.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)

    callbacks = [
        # 5. Start every rank from rank 0's weights.
        ddl.callbacks.BroadcastGlobalVariablesCallback(0),
        # 6. Logged loss/accuracy become means over ranks.
        ddl.callbacks.MetricAverageCallback(),
        # 7. Ramp the learning rate up over the first epoch (Goyal et al.).
        ddl.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1),
        # 8. Side effects on rank 0 only.
        ddl.callbacks.on_rank(0, keras.callbacks.ModelCheckpoint(args.checkpoint)),
    ]
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
              verbose=2 if rank == 0 else 0)

    # 9. Evaluate on each rank's validation shard, then average over ranks.
    loss, acc = model.evaluate(xv, yv, batch_size=256, verbose=0)
    acc = float(ddl.allreduce(tf.constant(acc, tf.float32), name="val_accuracy").numpy())
    if rank == 0:
        print(f"QUICKSTART ranks={size} val_accuracy={acc:.4f} "
              f"checkpoint={os.path.abspath(args.checkpoint)}", flush=True)


if __name__ == "__main__":
    main()
