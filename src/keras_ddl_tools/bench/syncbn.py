"""What ``SyncBatchNormalization`` costs a training step over plain ``BatchNormalization``.

    mpiexec -n 2 -bind-to core python -m keras_ddl.bench syncbn

Two copies of a 12-layer CNN (twelve 3x3 convolutions, each followed by a
normalization layer and a ReLU; 32x32x3 synthetic images, ``--batch`` 16 per
rank) train under ``DDLStrategy`` through ``model.fit``, the project's usual
path: one with ``keras.layers.BatchNormalization`` (each rank normalizes its
own batch), one with ``keras_ddl.SyncBatchNormalization`` (the statistics of
the global batch: one allreduce of ``3 x channels`` numbers per layer in the
forward pass, and its gradient's in the backward pass). Both start from the
same weights and read the same per-rank data.

A repetition is one ``fit`` of ``--steps`` steps per model; the two models
alternate repetition by repetition, in ABBA order, so a burst of load from
other jobs hits both and neither always goes first. One ``fit`` per model
before them (tracing) is left out, and inside a fit the first step is too
(``fit._StepClock``). A step's time is the slowest rank's median; the table
gives per variant the median over repetitions with its range, the
overhead of SyncBN's median over plain BN's (issue 48's target: <= +15%),
and ``paired``, the median over repetitions of SyncBN's step time over
plain BN's in the same repetition.
``same_weights`` says whether every rank ended with the same weights (for
plain BN the trainable ones: its moving statistics are each rank's own).
"""

import hashlib

import numpy as np

from .common import COMM, dump_json, print_table
from .fit import _StepClock, _compile

DEPTH = 12
CLASSES = 10
TARGET = 0.15


def _cnn12(keras, image_size, norm):
    """12 x (conv, norm, relu); pooling after the 4th and 8th convolution keeps
    the step short enough that the normalization layers' share is visible."""
    layers = [keras.Input((image_size, image_size, 3))]
    for i in range(DEPTH):
        # no bias: the normalization's beta takes its place
        layers += [keras.layers.Conv2D(16 if i < 4 else 32, 3, padding="same", use_bias=False),
                   norm(), keras.layers.ReLU()]
        if i in (3, 7):
            layers.append(keras.layers.MaxPooling2D())
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(CLASSES)]
    return keras.Sequential(layers)


def _digest(weights):
    return hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes()
                                   for w in weights)).hexdigest()


def _measure(args):
    import tensorflow as tf
    # one core's worth of work per process, as in the fit bench; must precede any op
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    import keras_ddl as ddl

    ddl.init()
    keras.utils.set_random_seed(0)
    with ddl.DDLStrategy().scope():
        models = {"plain_bn": _compile(keras, _cnn12(keras, args.image_size,
                                                     keras.layers.BatchNormalization)),
                  "sync_bn": _compile(keras, _cnn12(keras, args.image_size,
                                                    ddl.SyncBatchNormalization))}
    # same layer order and shapes: the two start from the same weights
    models["sync_bn"].set_weights(models["plain_bn"].get_weights())
    rng = np.random.default_rng(ddl.rank())   # each rank its own batch, as in the fit bench
    x = rng.random((args.batch, args.image_size, args.image_size, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, args.batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensors((x, y)).repeat().with_options(options)
    clock = _StepClock(keras)

    def timed(model):
        COMM.Barrier()
        model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0,
                  callbacks=[clock.callback])
        wall, _ = clock.per_step()
        return max(COMM.allgather(wall))   # a step lasts as long as its slowest rank's

    for model in models.values():
        timed(model)   # warm-up: tracing, not timed
    step_s = {name: [] for name in models}
    names = list(models)
    for rep in range(args.reps):
        for name in (names if rep % 2 == 0 else names[::-1]):   # ABBA
            step_s[name].append(timed(models[name]))
    same = {"plain_bn": _digest(models["plain_bn"].trainable_weights),
            "sync_bn": _digest(models["sync_bn"].weights)}
    same = {name: len(set(COMM.allgather(d))) == 1 for name, d in same.items()}
    return step_s, same


def main(args):
    if args.steps < 3:
        raise SystemExit("--steps must be at least 3")
    step_s, same = _measure(args)
    overhead = float(np.median(step_s["sync_bn"])) / float(np.median(step_s["plain_bn"])) - 1
    # under other jobs' load bursts, the ratio within each ABBA pair of fits
    # (about a second apart) is steadier than the ratio of the two medians
    paired = float(np.median(np.array(step_s["sync_bn"]) / np.array(step_s["plain_bn"]))) - 1
    rows = []
    for name, samples in step_s.items():
        ms = 1e3 * np.array(samples)
        median = float(np.median(ms))
        rows.append({"variant": name, "ranks": COMM.Get_size(), "batch_per_rank": args.batch,
                     "steps": args.steps, "reps": args.reps, "step_ms": median,
                     "min_ms": float(ms.min()), "max_ms": float(ms.max()),
                     "overhead": "-" if name == "plain_bn" else f"{100 * overhead:+.1f}%",
                     "paired": "-" if name == "plain_bn" else f"{100 * paired:+.1f}%",
                     "same_weights": "yes" if same[name] else "NO"})
    print_table(f"12-layer CNN {args.image_size}px, model.fit under DDLStrategy, "
                f"{args.threads} TF thread(s): SyncBatchNormalization vs BatchNormalization, "
                f"{args.reps} interleaved repetitions (target: overhead <= "
                f"+{100 * TARGET:.0f}%)", list(rows[0]), rows)
    dump_json(args.json, {"syncbn": rows, "overhead": overhead, "paired": paired,
                          "target": TARGET,
                          "step_s": step_s, "threads": args.threads,
                          "image_size": args.image_size})
