"""Multi-process checks of DistributedOptimizer, DistributedGradientTape and
the Keras callbacks (run by tests/mpi/test_keras_mpi.py under mpiexec with 2 and
3 ranks).

Every rank starts from its own random weights and trains on its own shard.
The single-process reference that every rank also computes locally starts
from rank 0's initial weights and trains on the global batches: for each
update, the concatenation, in rank order, of every rank's batch(es) for that
update. With equal per-rank batches and a mean loss, the average of the
per-rank gradients is the gradient of that global batch.
"""

import hashlib
import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf
from harness import case, run_cases
from mpi4py import MPI

import keras_ddl as ddl
from keras_ddl.optimizers import LARS

comm = MPI.COMM_WORLD
rank = ddl.rank()
size = ddl.size()

BATCH = 4   # per rank and step
STEPS = 4   # batches per epoch on each rank
EPOCHS = 2


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)),
                             keras.layers.Dense(5, activation="tanh"),
                             keras.layers.Dense(2)])


def shard(r, seed=0, rows=None):
    rows = BATCH * STEPS if rows is None else rows
    rng = np.random.default_rng(1000 * seed + r)
    x = rng.normal(size=(rows, 3)).astype(np.float32)
    y = rng.normal(size=(rows, 2)).astype(np.float32)
    return x, y


def global_data(k=1, seed=0):
    """Every rank's shard, regrouped so batch u of size BATCH*size*k holds
    each rank's k batches of update u, in rank order."""
    shards = [shard(r, seed) for r in range(size)]
    rows = BATCH * k
    xs, ys = [], []
    for u in range(STEPS // k):
        for x, y in shards:
            xs.append(x[u * rows:(u + 1) * rows])
            ys.append(y[u * rows:(u + 1) * rows])
    return np.concatenate(xs), np.concatenate(ys)


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def assert_same_on_all_ranks(arrays, what):
    digests = comm.allgather(digest(arrays))
    assert len(set(digests)) == 1, f"{what} differ between ranks: {digests}"


def values(variables):
    return [v.numpy() for v in variables]


def fit_distributed(make_optimizer, name, k=1, epochs=EPOCHS, callbacks=(), seed=0,
                    **layout):
    """model.fit on this rank's shard, from rank-dependent initial weights.

    Returns (model, rank 0's initial weights, whether this rank's initial
    weights differed from them). Nothing here asserts before the collective
    calls, so a failure on one rank cannot leave the others waiting.
    ``layout``: overlap_gradients / bucket_mb for the DistributedOptimizer.
    """
    model = make_model(100 + rank)
    mine = model.get_weights()
    w0 = comm.bcast(mine if rank == 0 else None, root=0)
    differed = any(not np.array_equal(a, b) for a, b in zip(mine, w0))
    opt = ddl.DistributedOptimizer(make_optimizer(), gradient_accumulation_steps=k, name=name,
                                   **layout)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = shard(rank, seed)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[ddl.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks])
    return model, w0, differed


def fit_reference(make_optimizer, w0, k=1, epochs=EPOCHS, seed=0):
    model = make_model(0)
    model.set_weights(w0)
    model.compile(optimizer=make_optimizer(), loss="mse", jit_compile=False)
    x, y = global_data(k, seed)
    model.fit(x, y, batch_size=BATCH * size * k, epochs=epochs, shuffle=False, verbose=0)
    return model


def check_against_reference(make_optimizer, name, k=1):
    model, w0, differed = fit_distributed(make_optimizer, name, k=k)
    assert_same_on_all_ranks(model.get_weights(), f"{name}: weights")
    assert_same_on_all_ranks(values(model.optimizer.variables), f"{name}: optimizer variables")
    assert differed or rank == 0, f"{name}: rank {rank} started from rank 0's weights already"
    reference = fit_reference(make_optimizer, w0, k=k)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    moved = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), w0))
    assert moved > 1e-3, f"{name}: training did not move the weights ({moved})"
    expected_updates = EPOCHS * STEPS // k
    assert int(model.optimizer.iterations) == expected_updates, \
        (int(model.optimizer.iterations), expected_updates)
    assert int(reference.optimizer.iterations) == expected_updates


@case
def fit_sgd_momentum_matches_single_process():
    check_against_reference(lambda: keras.optimizers.SGD(0.1, momentum=0.9), "sgd_case")


@case
def fit_adam_matches_single_process():
    check_against_reference(lambda: keras.optimizers.Adam(0.01), "adam_case")


@case
def fit_lars_matches_single_process():
    # The wrapper is optimizer-agnostic (AdamW, Lamb, LossScaleOptimizer
    # are checked in tests/unit/test_keras_single.py); LARS is ours.
    check_against_reference(lambda: LARS(0.5, momentum=0.9, eeta=0.01), "lars_case")


@case
def join_callback_trains_ranks_with_different_batch_counts():
    """Ranks hold different numbers of batches: with JoinCallback every step
    averages the ranks that still have a batch, and after each epoch all
    ranks continue from the same weights: those of a single process that
    trains, step by step, on the concatenation of the batches that exist."""
    batches = [2 + (r + 1) % size for r in range(size)]
    make_optimizer = lambda: keras.optimizers.SGD(0.1, momentum=0.9)  # noqa: E731
    model = make_model(100 + rank)
    w0 = comm.bcast(model.get_weights() if rank == 0 else None, root=0)
    model.compile(optimizer=ddl.DistributedOptimizer(make_optimizer(), name="join_fit"),
                  loss="mse", jit_compile=False)
    x, y = shard(rank, seed=3, rows=BATCH * batches[rank])
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[ddl.callbacks.JoinCallback(),
                         ddl.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_same_on_all_ranks(model.get_weights(), "weights after joins")
    assert_same_on_all_ranks(values(model.optimizer.variables), "optimizer variables after joins")
    reference = make_model(0)
    reference.set_weights(w0)
    reference.compile(optimizer=make_optimizer(), loss="mse", jit_compile=False)
    shards = [shard(q, seed=3, rows=BATCH * batches[q]) for q in range(size)]
    for _ in range(EPOCHS):
        for u in range(max(batches)):
            have = [shards[q] for q in range(size) if batches[q] > u]
            reference.train_on_batch(np.concatenate([sx[u * BATCH:(u + 1) * BATCH] for sx, _ in have]),
                                     np.concatenate([sy[u * BATCH:(u + 1) * BATCH] for _, sy in have]))
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert int(model.optimizer.iterations) == EPOCHS * max(batches)


@case
def join_in_a_custom_loop_with_gradient_tape():
    """A custom loop (DistributedGradientTape, tf.function step) where each
    rank stops after its own number of batches and joins; the last rank to
    join holds the weights of single-process steps on the batches that
    exist, and broadcasting them makes every rank equal."""
    batches = [2 + (r + 1) % size for r in range(size)]
    model = make_model(7)  # same start everywhere
    w0 = [w.copy() for w in model.get_weights()]
    opt = keras.optimizers.SGD(0.05)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        tape = ddl.DistributedGradientTape(tape, name="join_tape")
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    x, y = shard(rank, seed=4, rows=BATCH * batches[rank])
    joined = False
    try:
        for u in range(batches[rank]):
            step(x[u * BATCH:(u + 1) * BATCH], y[u * BATCH:(u + 1) * BATCH])
        joined = True
        last = ddl.join()
    finally:
        if not joined:
            ddl.join()
    assert last == int(np.argmax(batches)), (last, batches)
    ddl.broadcast_variables(model.variables, root_rank=last)
    assert_same_on_all_ranks(model.get_weights(), "weights after join and broadcast")
    reference = make_model(7)
    reference.set_weights(w0)
    ref_opt = keras.optimizers.SGD(0.05)
    shards = [shard(q, seed=4, rows=BATCH * batches[q]) for q in range(size)]
    for u in range(max(batches)):
        have = [shards[q] for q in range(size) if batches[q] > u]
        bx = np.concatenate([sx[u * BATCH:(u + 1) * BATCH] for sx, _ in have])
        by = np.concatenate([sy[u * BATCH:(u + 1) * BATCH] for _, sy in have])
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(reference(bx) - by))
        ref_opt.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                                    reference.trainable_variables))
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@case
def fit_gradient_accumulation_matches_single_process():
    # Two local batches per update: one allreduce per update, and the
    # update is the reference's on a global batch of 2 * BATCH * size rows.
    check_against_reference(lambda: keras.optimizers.SGD(0.1, momentum=0.9), "accum_case", k=2)


@case
def loss_scale_optimizer_agrees_on_nonfinite_steps():
    # One rank's first batch holds a NaN: the averaged gradients are NaN on
    # every rank, so every rank skips that step and halves its loss scale.
    model = make_model(100 + rank)
    opt = ddl.DistributedOptimizer(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024.0),
        name="lso_case")
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = shard(rank, rows=2 * BATCH)
    if rank == size - 1:
        x[1, 2] = np.nan
    broadcast = ddl.callbacks.BroadcastGlobalVariablesCallback(0)
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[broadcast])
    after_nan = model.get_weights()
    scale_after_nan = float(opt.inner_optimizer.dynamic_scale.numpy())
    updates_after_nan = int(opt.iterations)
    w0 = comm.bcast(after_nan if rank == 0 else None, root=0)
    model.fit(x[BATCH:], y[BATCH:], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_same_on_all_ranks(after_nan, "weights after the NaN step")
    assert_same_on_all_ranks(model.get_weights(), "weights after a finite step")
    assert scale_after_nan == 512.0, scale_after_nan
    assert updates_after_nan == 0, updates_after_nan
    assert int(opt.iterations) == 1
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), w0))


def op_types(fn, *args):
    return [op.type for op in fn.get_concrete_function(*args).graph.get_operations()]


@case
def gradient_layouts_are_bitwise_identical_and_overlap():
    # One allreduce per gradient (the default), buckets, or one grouped
    # allreduce after the backward pass: the same bits, on every rank.
    layouts = {"per_gradient": {}, "buckets": {"bucket_mb": 50 / 2**20},
               "grouped": {"overlap_gradients": False}}
    weights = {}
    for label, layout in layouts.items():
        model, w0, _ = fit_distributed(lambda: keras.optimizers.SGD(0.1, momentum=0.9),
                                       f"layout_{label}", **layout)
        assert model.optimizer.overlap_gradients == (label != "grouped")
        weights[label] = model.get_weights()
        assert_same_on_all_ranks(weights[label], f"{label}: weights")
    moved = max(np.max(np.abs(a - b)) for a, b in zip(weights["grouped"], w0))
    assert moved > 1e-3, moved
    for label in ("per_gradient", "buckets"):
        for a, b in zip(weights[label], weights["grouped"]):
            np.testing.assert_array_equal(a, b, err_msg=f"{label} vs one grouped allreduce")

    # The graph: each gradient's allreduce depends on that gradient only.
    model = make_model(0)
    variables = model.trainable_variables  # kernel 3x5, bias 5, kernel 5x2, bias 2
    x, y = shard(rank)
    counts = {}
    for label, layout in layouts.items():
        opt = ddl.DistributedOptimizer(keras.optimizers.SGD(0.0), name=f"graph_{label}",
                                       **layout)
        opt.build(variables)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            opt.apply(tape.gradient(loss, variables), variables)

        kinds = op_types(step, x, y)
        step(x, y)
        counts[label] = (kinds.count("DdlAllreduce"), kinds.count("DdlGroupedAllreduce"))
    # 50-byte buckets, last variable first: [bias 8 B, kernel 40 B], [bias 20 B],
    # [kernel 60 B]
    assert counts == {"per_gradient": (4, 0), "buckets": (0, 3), "grouped": (0, 1)}, counts


def mixed_float16_overflow(k):
    """compile() wraps the DistributedOptimizer in a LossScaleOptimizer; the
    last rank's first batch overflows float16 (1e5 > 65504)."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = make_model(100 + rank)
        w0 = comm.bcast(model.get_weights() if rank == 0 else None, root=0)
        opt = ddl.DistributedOptimizer(keras.optimizers.SGD(0.1), gradient_accumulation_steps=k,
                                       name=f"f16_case_{k}")
        model.compile(optimizer=opt, loss="mse", jit_compile=False)
        model.optimizer.initial_scale = 1024.0  # not built yet; leaves the fp16 range alone
        x, y = shard(rank)
        if rank == size - 1:
            x[1, 2] = 1e5
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[ddl.callbacks.BroadcastGlobalVariablesCallback(0)])
        reference = None
        if k == 1:  # the same global batches in one process: the same step is skipped
            reference = make_model(0)
            reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            reference.optimizer.initial_scale = 1024.0
            reference.set_weights(w0)
            gx, gy = global_data()
            gx[(size - 1) * BATCH + 1, 2] = 1e5
            reference.fit(gx, gy, batch_size=BATCH * size, epochs=1, shuffle=False, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    lso = model.optimizer
    assert isinstance(lso, keras.optimizers.LossScaleOptimizer), type(lso)
    assert lso.inner_optimizer is opt
    weights = model.get_weights()
    assert_same_on_all_ranks(weights + values(lso.variables), "weights and optimizer state")
    assert all(np.all(np.isfinite(w)) for w in weights)
    assert float(lso.dynamic_scale.numpy()) == lso.initial_scale / 2  # skipped once, everywhere
    assert any(not np.array_equal(a, b) for a, b in zip(weights, w0)), "no step was applied"
    return model, reference


@case
def mixed_float16_overflow_on_one_rank_is_skipped_everywhere():
    # The gradients are averaged before the loss-scale check: every rank sees
    # the inf, skips the step and halves its loss scale, like one process on
    # the global batch.
    model, reference = mixed_float16_overflow(k=1)
    assert int(model.optimizer.iterations) == STEPS - 1
    assert float(reference.optimizer.dynamic_scale.numpy()) == \
        float(model.optimizer.dynamic_scale.numpy())
    assert int(reference.optimizer.iterations) == STEPS - 1
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)


@case
def mixed_float16_overflow_with_accumulation_is_skipped_everywhere():
    # Accumulating locally, the ranks agree on the check itself: the
    # overflowing micro-batch is skipped on every rank; the other three
    # micro-batches make one update (the 4th waits for a partner).
    model, _ = mixed_float16_overflow(k=2)
    assert int(model.optimizer.iterations) == 1


@case
def gradient_tape_averages_in_eager_and_graph():
    keras.utils.set_random_seed(7)  # same weights everywhere
    model = keras.Sequential([keras.Input((2,), dtype="int32"),
                              keras.layers.Embedding(10, 3),
                              keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    unused = tf.Variable(1.0)
    sources = model.trainable_variables + [unused]
    rng = np.random.default_rng(5)
    xs = [rng.integers(0, 10, size=(BATCH, 2)).astype(np.int32) for _ in range(size)]
    ys = [rng.normal(size=(BATCH, 1)).astype(np.float32) for _ in range(size)]

    def loss_of(x, y):
        return tf.reduce_mean(tf.square(model(x) - y))

    def distributed(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(x, y)
        return ddl.DistributedGradientTape(tape).gradient(loss, sources)

    def entered(x, y):
        with ddl.DistributedGradientTape(tf.GradientTape()) as tape:
            loss = loss_of(x, y)
        return tape.gradient(loss, sources)

    with tf.GradientTape() as tape:
        loss = loss_of(np.concatenate(xs), np.concatenate(ys))
    want = [None if g is None else tf.convert_to_tensor(g).numpy()
            for g in tape.gradient(loss, sources)]
    assert want[-1] is None and want[0].shape == (10, 3)
    def bucketed(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(x, y)
        return ddl.DistributedGradientTape(tape, bucket_mb=1).gradient(loss, sources)

    for label, fn in (("eager", distributed), ("graph", tf.function(distributed)),
                      ("entered", entered), ("buckets", tf.function(bucketed))):
        got = fn(xs[rank], ys[rank])
        assert got[-1] is None, f"{label}: the unconnected gradient is {got[-1]}"
        assert not isinstance(got[0], tf.IndexedSlices), f"{label}: {type(got[0])}"
        got = [g.numpy() for g in got[:-1]]
        assert_same_on_all_ranks(got, f"{label} gradients")
        for g, w in zip(got, want[:-1]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7, err_msg=label)


class LearningRateRecorder(keras.callbacks.Callback):
    """The optimizer's learning rate (and SGD momentum slots) at every
    batch begin, and the slots at every batch end."""

    def __init__(self):
        super().__init__()
        self.epoch = None
        self.begins = []   # (epoch, batch, lr, slots)
        self.ends = []     # slots

    def slots(self):
        inner = self.model.optimizer.inner_optimizer
        return [m.numpy() for m in getattr(inner, "momentums", [])] if inner.built else []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        lr = float(self.model.optimizer.learning_rate.numpy())
        self.begins.append((self.epoch, batch, lr, self.slots()))

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(self.slots())


def check_momentum_correction(recorder, corrected):
    """Between batches the slots are only rescaled by new_lr / old_lr."""
    rescaled = 0
    for t in range(1, len(recorder.begins)):
        before, after = recorder.ends[t - 1], recorder.begins[t][3]
        ratio = np.float32(recorder.begins[t][2] / recorder.begins[t - 1][2]) if corrected else 1
        for b, a in zip(before, after):
            np.testing.assert_allclose(a, b * ratio, rtol=1e-6, atol=0)
        if ratio != 1 and any(np.any(b != 0) for b in before):
            rescaled += 1
    assert rescaled > 0 or not corrected, "no learning-rate change with momentum to correct"


@case
def warmup_callback_follows_formula():
    initial_lr, warmup = 0.3, 2
    recorder = LearningRateRecorder()
    warmup_cb = ddl.callbacks.LearningRateWarmupCallback(initial_lr, warmup_epochs=warmup)
    model, _, _ = fit_distributed(lambda: keras.optimizers.SGD(0.01, momentum=0.9), "warmup_case",
                                  epochs=3, callbacks=[warmup_cb, recorder])
    assert_same_on_all_ranks(model.get_weights(), "weights")
    assert len(recorder.begins) == 3 * STEPS
    for epoch, batch, lr, _ in recorder.begins:
        if epoch < warmup:
            progress = min(1.0, (epoch + batch / STEPS) / warmup)
            expected = initial_lr / size * (1 + (size - 1) * progress)
        else:
            expected = initial_lr
        assert abs(lr - np.float32(expected)) <= 1e-6 * expected, (epoch, batch, lr, expected)
    assert recorder.begins[0][2] == np.float32(initial_lr / size)
    lrs = [lr for epoch, _, lr, _ in recorder.begins if epoch < warmup]
    assert all(a < b for a, b in zip(lrs, lrs[1:])), lrs
    check_momentum_correction(recorder, corrected=True)


@case
def schedule_callback_follows_formula():
    # Staircase, in an epoch range: lr(e) = 0.2 * 0.1**e for 1 <= e < 3,
    # untouched before, left as it was after.
    recorder = LearningRateRecorder()
    schedule = ddl.callbacks.LearningRateScheduleCallback(0.2, lambda e: 0.1 ** e,
                                                          start_epoch=1, end_epoch=3)
    fit_distributed(lambda: keras.optimizers.SGD(0.05, momentum=0.9), "stair_case", epochs=4,
                    callbacks=[schedule, recorder])
    expected = {0: 0.05, 1: 0.02, 2: 0.002, 3: 0.002}
    for epoch, batch, lr, _ in recorder.begins:
        assert lr == np.float32(expected[epoch]), (epoch, batch, lr)
    check_momentum_correction(recorder, corrected=True)


class LogsRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


@case
def metric_average_callback_logs_are_global():
    before, after = LogsRecorder(), LogsRecorder()
    model = make_model(100 + rank)
    model.compile(optimizer=ddl.DistributedOptimizer(keras.optimizers.SGD(0.05), name="avg_case"),
                  loss="mse", metrics=["mae"], jit_compile=False)
    x, y = shard(rank)
    val = shard(rank, seed=3, rows=2 * BATCH)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_data=val,
              callbacks=[ddl.callbacks.BroadcastGlobalVariablesCallback(0), before,
                         ddl.callbacks.MetricAverageCallback(), after])
    all_before = comm.allgather(before.logs)
    all_after = comm.allgather(after.logs)
    keys = {"loss", "mae", "val_loss", "val_mae"}
    assert keys <= set(after.logs[0]), after.logs[0]
    assert all(a == all_after[0] for a in all_after), f"averaged logs differ: {all_after}"
    differs = False
    for epoch in range(2):
        for key in keys:
            per_rank = [logs[epoch][key] for logs in all_before]
            differs = differs or len(set(per_rank)) > 1
            np.testing.assert_allclose(after.logs[epoch][key], np.mean(per_rank), rtol=1e-12,
                                       err_msg=f"epoch {epoch} {key}")
            assert model.history.history[key][epoch] == after.logs[epoch][key]
    assert differs, "per-rank logs were equal already: the check proves nothing"


class HookCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.counts = {}

    def _count(self, hook):
        self.counts[hook] = self.counts.get(hook, 0) + 1

    def on_train_begin(self, logs=None):
        self._count("train_begin")

    def on_epoch_end(self, epoch, logs=None):
        self._count("epoch_end")

    def on_train_batch_end(self, batch, logs=None):
        self._count("train_batch_end")


@case
def on_rank_checkpoint_writes_one_file_set():
    directory = comm.bcast(tempfile.mkdtemp(prefix="ddl_ckpt_") if rank == 0 else None, root=0)
    try:
        pattern = os.path.join(directory, f"r{rank}-{{epoch}}.weights.h5")
        counter = HookCounter()
        wrapped = ddl.callbacks.on_rank(size - 1, counter)
        model, _, _ = fit_distributed(
            lambda: keras.optimizers.SGD(0.05), "ckpt_case",
            callbacks=[ddl.callbacks.on_rank(0, keras.callbacks.ModelCheckpoint(
                pattern, save_weights_only=True)), wrapped])
        comm.Barrier()
        files = sorted(os.listdir(directory))
        final = model.get_weights()
        restored = make_model(0)
        restored.load_weights(os.path.join(directory, f"r0-{EPOCHS}.weights.h5"))
        comm.Barrier()
    finally:
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    assert files == [f"r0-{e}.weights.h5" for e in range(1, EPOCHS + 1)], files
    for a, b in zip(restored.get_weights(), final):
        np.testing.assert_array_equal(a, b)
    expected = ({"train_begin": 1, "epoch_end": EPOCHS, "train_batch_end": EPOCHS * STEPS}
                if rank == size - 1 else {})
    assert counter.counts == expected, counter.counts
    assert counter.model is model


def roundtrip(make_optimizer, name, k):
    """Trains, saves on rank 0, loads on every rank; both continue."""
    directory = comm.bcast(tempfile.mkdtemp(prefix="ddl_save_") if rank == 0 else None, root=0)
    path = os.path.join(directory, "model.keras")
    try:
        model, _, _ = fit_distributed(make_optimizer, name, k=k, epochs=1)
        if rank == 0:
            model.save(path)
        comm.Barrier()
        loaded = keras.saving.load_model(path)
        comm.Barrier()
    finally:
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    saved_state = values(model.optimizer.variables)
    loaded_state = values(loaded.optimizer.variables)
    x, y = shard(rank, seed=1)
    for m in (model, loaded):
        m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_same_on_all_ranks(loaded.get_weights(), "continued weights")

    opt = loaded.optimizer
    assert isinstance(opt, ddl.DistributedOptimizer), type(opt)
    assert type(opt.inner_optimizer) is type(model.optimizer.inner_optimizer)
    assert opt.inner_optimizer.get_config() == model.optimizer.inner_optimizer.get_config()
    assert opt.get_config() == model.optimizer.get_config()
    assert opt.accumulation_steps == k and opt.name == name
    assert len(loaded_state) == len(saved_state)
    for a, b in zip(loaded_state, saved_state):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(values(loaded.optimizer.variables), values(model.optimizer.variables)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    return model, saved_state


@case
def keras_file_roundtrip_sgd_continues_training():
    # With accumulation over 2 batches, saved at an update boundary.
    model, state = roundtrip(lambda: keras.optimizers.SGD(0.05, momentum=0.9), "save_sgd_case", 2)
    assert int(state[0]) == STEPS // 2  # iterations come first
    assert all(np.any(m.numpy() != 0) for m in model.optimizer.inner_optimizer.momentums)


@case
def keras_file_roundtrip_lars_continues_training():
    model, state = roundtrip(lambda: LARS(0.5, momentum=0.9, eeta=0.01), "save_lars_case", 1)
    assert int(state[0]) == STEPS
    assert all(np.any(v.numpy() != 0) for v in model.optimizer.inner_optimizer._velocities)


if __name__ == "__main__":
    run_cases()
