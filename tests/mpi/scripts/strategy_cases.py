"""DDLStrategy under mpiexec (run by tests/mpi/test_strategy_mpi.py with 2 and 3 ranks).

Every case compares against a single-process reference that each rank
computes locally with plain Keras (no strategy) on the concatenated global
batches, starting from the same weights. Ranks deliberately seed their
random generators differently, so identical results can only come from the
strategy. Models are tiny and runs are a few steps: the cost is tracing.
"""

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from harness import case, run_cases
from mpi4py import MPI

import keras
import keras_ddl as ddl

COMM = MPI.COMM_WORLD
rank = ddl.rank()
size = ddl.size()
B = 4                    # per-rank batch
GB = B * size            # global batch
STEPS = 3                # steps per epoch
FEATURES, CLASSES = 6, 4

strategy = ddl.DDLStrategy()


# --- helpers ------------------------------------------------------------------

def seed_differently(offset=0):
    keras.utils.set_random_seed(1000 * (offset + 1) + 17 * rank)


def data(samples=GB * STEPS, seed=0):
    """The same arrays on every rank."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, samples).astype(np.int64)
    return x, y


def dataset(x, y, batch=GB):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def mlp():
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(CLASSES)])


def compile_model(model, lr=0.1, run_eagerly=False):
    model.compile(keras.optimizers.SGD(lr, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy", keras.metrics.SparseCategoricalCrossentropy(
                      from_logits=True, name="xent")],
                  run_eagerly=run_eagerly)
    return model


def reference_model(build, weights, lr=0.1):
    """The single-process model: built outside any strategy, same weights."""
    assert not tf.distribute.has_strategy()
    model = compile_model(build(), lr, run_eagerly=True)  # eager: no tracing cost
    model.set_weights(weights)
    return model


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def same_on_all_ranks(arrays, what):
    digests = COMM.allgather(digest(arrays))
    assert len(set(digests)) == 1, f"{what} differ between ranks: {digests}"


def same_json_on_all_ranks(obj, what):
    text = json.dumps(obj, sort_keys=True)
    texts = COMM.allgather(text)
    assert all(t == text for t in texts), f"{what} differ between ranks:\n" + "\n".join(texts)


def all_state(model):
    """Every variable a model carries: weights, optimizer and metric state."""
    variables = list(model.variables) + list(model.optimizer.variables)
    for m in model.metrics:
        variables += list(m.variables)
    return [v.numpy() for v in variables]


def assert_weights_close(got, expected, what, rtol=1e-5, atol=1e-6):
    assert len(got) == len(expected), (len(got), len(expected))
    for i, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{what}: weight {i}")


def assert_history_close(got, expected, what, rtol=1e-5, atol=1e-6):
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=rtol, atol=atol,
                                   err_msg=f"{what}: history[{key!r}]")


def shared_tmpdir():
    path = tempfile.mkdtemp(prefix="ddl_strategy_") if rank == 0 else None
    return COMM.bcast(path, root=0)


# --- cases ---------------------------------------------------------------------

@case
def replicas_run_reduce_gather_and_contexts():
    assert strategy.num_replicas_in_sync == size
    assert strategy.extended.should_checkpoint == (rank == 0)

    @tf.function
    def replica_ids():
        return strategy.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
    assert int(replica_ids()) == rank

    # strategy.reduce: one value per replica, reduced across processes
    value = tf.constant([rank + 1.0, 10.0 * rank])
    total = strategy.reduce("SUM", value, axis=None).numpy()
    np.testing.assert_array_equal(total, [size * (size + 1) / 2, 10.0 * size * (size - 1) / 2])
    mean = strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None).numpy()
    np.testing.assert_allclose(mean, total / size, rtol=1e-6)
    rows = tf.fill([rank + 1, 2], float(rank))          # different row counts per rank
    mean0 = strategy.reduce("MEAN", rows, axis=0).numpy()
    expected = sum(r * (r + 1) for r in range(size)) / sum(r + 1 for r in range(size))
    np.testing.assert_allclose(mean0, [expected, expected], rtol=1e-6)

    # in a replica context inside tf.function
    @tf.function
    def all_reduced(v):
        return strategy.run(lambda t: tf.distribute.get_replica_context().all_reduce("SUM", t),
                            args=(v,))
    np.testing.assert_array_equal(all_reduced(value).numpy(), total)

    @tf.function
    def all_gathered(v):
        return strategy.run(lambda t: tf.distribute.get_replica_context().all_gather(t, axis=0),
                            args=(v,))
    np.testing.assert_array_equal(all_gathered(tf.fill([rank + 1], rank)).numpy(),
                                  [r for r in range(size) for _ in range(r + 1)])

    gathered = strategy.gather(tf.fill([1, rank + 1], rank), axis=1).numpy()
    np.testing.assert_array_equal(gathered, [[r for r in range(size) for _ in range(r + 1)]])
    gathered0 = strategy.gather(tf.fill([rank + 1, 2], rank), axis=0).numpy()
    np.testing.assert_array_equal(gathered0[:, 0], [r for r in range(size) for _ in range(r + 1)])

    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync))
    assert per_replica == (rank, size), per_replica

    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id,
                         ctx.num_replicas_in_sync, ctx.get_per_replica_batch_size(GB)))
        return tf.data.Dataset.range(4).batch(2)
    list(strategy.distribute_datasets_from_function(dataset_fn))
    assert contexts == [(size, rank, size, B)], contexts


@case
def variables_start_from_rank_zero_whatever_the_seed():
    seed_differently()
    plain = mlp()  # no strategy: the seeds really differ per rank
    if size > 1:
        digests = COMM.allgather(digest(plain.get_weights()))
        assert len(set(digests)) == size, "ranks were meant to draw different initial weights"
    seed_differently()
    with strategy.scope():
        model = compile_model(keras.Sequential([
            keras.Input((FEATURES,)), keras.layers.Dense(8), keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.3), keras.layers.Dense(CLASSES)]))
        model.optimizer.build(model.trainable_variables)
    same_on_all_ranks(all_state(model), "initial variables")
    rank0 = COMM.bcast(model.get_weights() if rank == 0 else None, root=0)
    assert digest(model.get_weights()) == digest(rank0)


@case
def fit_evaluate_predict_match_one_process_on_the_global_batch():
    seed_differently()
    x, y = data(seed=1)
    xv, yv = data(samples=GB * 2, seed=2)
    with strategy.scope():
        model = compile_model(mlp())
    w0 = model.get_weights()
    ref = reference_model(mlp, w0)

    # fit on a dataset batched with the global batch size, with validation
    history = model.fit(dataset(x, y), epochs=2, validation_data=dataset(xv, yv),
                        verbose=0).history
    expected = ref.fit(dataset(x, y), epochs=2, validation_data=dataset(xv, yv),
                       verbose=0).history
    assert set(history) == {"loss", "accuracy", "xent", "val_loss", "val_accuracy", "val_xent"}
    assert_weights_close(model.get_weights(), ref.get_weights(), "weights after 2x3 steps")
    same_on_all_ranks(all_state(model), "weights, optimizer and metric state")
    same_json_on_all_ranks(history, "histories")
    assert_history_close(history, expected, "history vs one process")
    assert expected["loss"][0] != expected["loss"][1]  # it did train

    # numpy arrays: batch_size is the global batch too
    history = model.fit(x, y, batch_size=GB, epochs=1, shuffle=False, verbose=0).history
    expected = ref.fit(x, y, batch_size=GB, epochs=1, shuffle=False, verbose=0).history
    assert_weights_close(model.get_weights(), ref.get_weights(), "weights (numpy input)")
    same_on_all_ranks(all_state(model), "state (numpy input)")
    same_json_on_all_ranks(history, "histories (numpy input)")
    assert_history_close(history, expected, "history (numpy input)")

    # evaluate: global metrics, also with a last batch split unevenly
    xe, ye = data(samples=GB * 2 + size + 1, seed=4)
    for args, kwargs in (((dataset(xe, ye),), {}), ((xe, ye), {"batch_size": GB})):
        got = model.evaluate(*args, verbose=0, return_dict=True, **kwargs)
        want = ref.evaluate(*args, verbose=0, return_dict=True, **kwargs)
        same_json_on_all_ranks(got, "evaluate results")
        assert_history_close({k: [v] for k, v in got.items()},
                             {k: [v] for k, v in want.items()}, "evaluate vs one process")
    if size > 1:  # each rank's own rows give different numbers: agreement is not trivial
        local = ref.evaluate(xe[rank::size], ye[rank::size], verbose=0, return_dict=True)
        assert len(set(COMM.allgather(local["loss"]))) > 1

    # predict: this rank's rows of every global batch; gather_predictions
    # puts every rank's rows back in dataset order
    want = ref.predict(xe, batch_size=GB, verbose=0)
    mine = model.predict(xe, batch_size=GB, verbose=0)
    rows = []
    for start in range(0, len(xe), GB):
        n = min(GB, len(xe) - start)
        base, extra = divmod(n, size)
        first = start + rank * base + min(rank, extra)
        rows.extend(range(first, first + base + (rank < extra)))
    assert mine.shape == (len(rows), CLASSES), (mine.shape, len(rows))
    np.testing.assert_allclose(mine, want[rows], rtol=1e-5, atol=1e-6)
    everything = ddl.gather_predictions(mine, batch_size=GB)
    np.testing.assert_allclose(everything, want, rtol=1e-5, atol=1e-6)
    same_on_all_ranks([everything], "gathered predictions")
    nested = ddl.gather_predictions({"a": mine, "b": [mine[:, :1]]}, batch_size=GB)
    np.testing.assert_array_equal(nested["b"][0], everything[:, :1])
    assert ddl.gather_predictions(mine).shape == want.shape  # rank order


@case
def per_replica_batches_from_function_or_unsharded_dataset():
    seed_differently()
    x, y = data(seed=6)
    # rank r reads rows r, r+size, ... in per-replica batches of B; the global
    # batch of step i is the concatenation of every rank's batch i
    shards = [(x[r::size], y[r::size]) for r in range(size)]
    gx = np.concatenate([np.concatenate([s[0][i * B:(i + 1) * B] for s in shards])
                         for i in range(STEPS)])
    gy = np.concatenate([np.concatenate([s[1][i * B:(i + 1) * B] for s in shards])
                         for i in range(STEPS)])

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.batch(ctx.get_per_replica_batch_size(GB))

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    own_shard = tf.data.Dataset.from_tensor_slices(shards[rank]).batch(B).with_options(options)
    with strategy.scope():
        model = compile_model(mlp())
    ref = reference_model(mlp, model.get_weights())
    # one epoch from each source: both give the same global batches
    for label, inputs in (("distribute_datasets_from_function",
                           strategy.distribute_datasets_from_function(dataset_fn)),
                          ("auto_shard_policy OFF", own_shard)):
        history = model.fit(inputs, epochs=1, verbose=0).history
        expected = ref.fit(dataset(gx, gy), epochs=1, verbose=0).history
        assert_weights_close(model.get_weights(), ref.get_weights(), label)
        same_on_all_ranks(model.get_weights(), label)
        same_json_on_all_ranks(history, label)
        assert_history_close(history, expected, label)


class CustomStepModel(keras.Model):
    """A user-written train_step: weighted loss, manual metric updates."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.out = keras.layers.Dense(CLASSES)
        self.tracker = keras.metrics.Mean(name="my_loss")

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=logits)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        per_sample = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        self.tracker.update_state(per_sample)
        return {"my_loss": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


@case
def custom_train_step():
    seed_differently()
    x, y = data(seed=7)

    def build():
        model = CustomStepModel()
        model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      run_eagerly=not tf.distribute.has_strategy())
        model(x[:1])
        return model

    with strategy.scope():
        model = build()
    w0 = model.get_weights()
    history = model.fit(dataset(x, y), epochs=2, verbose=0).history
    ref = build()
    ref.set_weights(w0)
    expected = ref.fit(dataset(x, y), epochs=2, verbose=0).history
    assert set(history) == {"my_loss"}
    assert_weights_close(model.get_weights(), ref.get_weights(), "custom train_step", rtol=2e-5)
    same_on_all_ranks(model.get_weights(), "custom train_step weights")
    same_json_on_all_ranks(history, "custom train_step history")
    assert_history_close(history, expected, "custom train_step history")


@case
def custom_loop_with_run_and_reduce():
    custom_loop(strategy)  # default: one allreduce per gradient


@case
def custom_loop_with_one_grouped_allreduce():
    custom_loop(ddl.DDLStrategy(overlap_gradients=False))


def custom_loop(strategy):
    seed_differently()
    x, y = data(seed=8)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        model = mlp()
        optimizer = keras.optimizers.SGD(0.2)
    w0 = model.get_weights()

    def replica_step(batch):
        bx, by = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(by, model(bx, training=True))  # scaled by 1/num_replicas
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(batch):
        per_replica = strategy.run(replica_step, args=(batch,))
        return strategy.reduce("SUM", per_replica, axis=None)

    batches = list(strategy.experimental_distribute_dataset(dataset(x, y)))
    losses = [float(train_step(batch)) for batch in batches]
    if size > 1:  # the gradient sum: one grouped op, or one op per gradient
        graph = train_step.get_concrete_function(batches[0]).graph
        kinds = [op.type for op in graph.get_operations()]
        n = len(model.trainable_variables)
        if strategy.extended._overlap:
            assert kinds.count("DdlGroupedAllreduce") == 0 and kinds.count("DdlAllreduce") >= n
        else:
            assert kinds.count("DdlGroupedAllreduce") == 1, kinds.count("DdlGroupedAllreduce")

    ref = mlp()
    ref.set_weights(w0)
    ref_optimizer = keras.optimizers.SGD(0.2)
    expected = []
    for bx, by in dataset(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(by, ref(bx, training=True))
        grads = tape.gradient(loss, ref.trainable_variables)
        ref_optimizer.apply_gradients(zip(grads, ref.trainable_variables))
        expected.append(float(loss))
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    same_json_on_all_ranks(losses, "reduced losses")
    assert_weights_close(model.get_weights(), ref.get_weights(), "custom loop")
    same_on_all_ranks(model.get_weights(), "custom loop weights")


@case
def mixed_bfloat16_policy():
    seed_differently()
    x, y = data(seed=9)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with strategy.scope():
            model = compile_model(mlp(), lr=0.05)
        assert model.layers[0].compute_dtype == "bfloat16"
        w0 = model.get_weights()
        history = model.fit(dataset(x, y), epochs=2, verbose=0).history
        ref = reference_model(mlp, w0, lr=0.05)
        expected = ref.fit(dataset(x, y), epochs=2, verbose=0).history
    finally:
        keras.mixed_precision.set_global_policy("float32")
    same_on_all_ranks(all_state(model), "bf16 state")
    same_json_on_all_ranks(history, "bf16 history")
    # bfloat16 keeps 8 bits of mantissa; sub-batches and the global batch
    # round a little differently
    assert_weights_close(model.get_weights(), ref.get_weights(), "bf16 weights",
                         rtol=2e-2, atol=2e-3)
    assert_history_close(history, expected, "bf16 history", rtol=2e-2, atol=2e-3)


@case
def gradient_layouts_give_bitwise_identical_training():
    # One allreduce per gradient (default), 200-byte buckets, one grouped
    # allreduce: the same bits, however the engine fused the tensors.
    x, y = data(seed=13)
    seed_differently()
    with strategy.scope():
        w0 = mlp().get_weights()
    results = {}
    for label, kwargs in (("per_gradient", {}), ("buckets", {"bucket_mb": 200 / 2**20}),
                          ("grouped", {"overlap_gradients": False})):
        layout = ddl.DDLStrategy(**kwargs)
        with layout.scope():
            model = compile_model(mlp())
        model.set_weights(w0)
        history = model.fit(dataset(x, y), epochs=2, verbose=0).history
        results[label] = (all_state(model), history)
    same_on_all_ranks(results["per_gradient"][0], "state")
    ref = reference_model(mlp, w0)
    ref.fit(dataset(x, y), epochs=2, verbose=0)
    assert_weights_close(results["per_gradient"][0][:4], ref.get_weights(), "per gradient")
    for label in ("buckets", "grouped"):
        assert digest(results[label][0]) == digest(results["per_gradient"][0]), label
        assert results[label][1] == results["per_gradient"][1], label


@case
def fp16_compression_of_gradients():
    # Gradients cross the network as float16: every rank ends with the same
    # bits, close to one process in float32 (the sum is rounded to 16 bits).
    # Inside one node's shared memory nothing is converted.
    x, y = data(seed=21)
    seed_differently()
    with strategy.scope():
        w0 = mlp().get_weights()
    compressed = ddl.DDLStrategy(compression=ddl.Compression.fp16)
    with compressed.scope():
        model = compile_model(mlp())
    model.set_weights(w0)
    model.fit(dataset(x, y), epochs=1, verbose=0)
    same_on_all_ranks(all_state(model), "state with fp16 gradients")
    ref = reference_model(mlp, w0)
    ref.fit(dataset(x, y), epochs=1, verbose=0)
    for got, want in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)
    # Were they really rounded to 16 bits where they crossed a network? The
    # float32 run differs in bits; on one node it is the same run.
    with strategy.scope():
        full = compile_model(mlp())
    full.set_weights(w0)
    full.fit(dataset(x, y), epochs=1, verbose=0)
    if ddl.allreduce_algorithm() == "shared_memory":
        assert digest(all_state(full)) == digest(all_state(model)), "fp16 converted in a node"
    else:
        assert digest(all_state(full)) != digest(all_state(model)), "fp16 changed nothing"
    try:
        ddl.DDLStrategy(compression="fp16")
    except ValueError as e:
        assert "compression" in str(e), e
    else:
        raise AssertionError("a string compression was accepted")


@case
def mixed_float16_overflow_on_one_rank_is_skipped_everywhere():
    # compile() wraps SGD in a LossScaleOptimizer. The last rank's rows of the
    # first global batch overflow float16: the gradients are summed before
    # the finiteness check, so every rank (like one process on the global
    # batch) skips that step and halves its loss scale; nobody waits.
    seed_differently()
    x, y = data(seed=14)
    x[GB - 1, 0] = 1e5  # the last row of batch 0: the last rank's slice
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = compile_model(mlp(), lr=0.05)
        model.optimizer.initial_scale = 1024.0  # not built yet
        w0 = model.get_weights()
        history = model.fit(dataset(x, y), epochs=1, verbose=0).history
        ref = reference_model(mlp, w0, lr=0.05)
        ref.optimizer.initial_scale = 1024.0
        expected = ref.fit(dataset(x, y), epochs=1, verbose=0).history
    finally:
        keras.mixed_precision.set_global_policy("float32")
    lso = model.optimizer
    assert isinstance(lso, keras.optimizers.LossScaleOptimizer), type(lso)
    same_on_all_ranks(all_state(model), "float16 state")
    same_json_on_all_ranks(history, "float16 history")
    assert float(lso.dynamic_scale.numpy()) == 512.0 == float(ref.optimizer.dynamic_scale.numpy())
    assert int(lso.iterations) == STEPS - 1 == int(ref.optimizer.iterations)
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    assert_weights_close(model.get_weights(), ref.get_weights(), "float16 weights",
                         rtol=1e-2, atol=1e-3)
    assert not np.isfinite(history["loss"][0]) and not np.isfinite(expected["loss"][0])


@case
def batchnorm_and_dropout_stay_bitwise_identical():
    seed_differently()
    x, y = data(seed=10)

    def build():
        return keras.Sequential([
            keras.Input((FEATURES,)), keras.layers.Dense(12), keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"), keras.layers.Dropout(0.25),
            keras.layers.Dense(CLASSES)])

    with strategy.scope():
        model = compile_model(build())
        model.optimizer.build(model.trainable_variables)
    history = model.fit(dataset(x, y), epochs=2, verbose=0).history
    same_on_all_ranks(all_state(model), "state with BatchNormalization and Dropout")
    same_json_on_all_ranks(history, "history with BatchNormalization and Dropout")
    # moving mean = mean over ranks of each rank's update, as tf.distribute's MEAN
    bn = model.layers[1]
    assert np.any(bn.moving_mean.numpy() != 0)


@case
def batchnorm_moving_statistics_are_averaged_once_per_step():
    seed_differently()
    x, y = data(seed=12)
    momentum = 0.9

    def build():
        return keras.Sequential([
            keras.Input((FEATURES,)), keras.layers.BatchNormalization(momentum=momentum),
            keras.layers.Dense(8), keras.layers.BatchNormalization(momentum=momentum),
            keras.layers.Dense(CLASSES)])

    import keras_ddl.keras.strategy as strategy_module
    calls = []
    real_allreduce, real_grouped = strategy_module.collectives.allreduce, \
        strategy_module.collectives.grouped_allreduce

    def allreduce(tensor, *args, **kwargs):
        calls.append(("allreduce", kwargs.get("op", args[0] if args else None), 1))
        return real_allreduce(tensor, *args, **kwargs)

    def grouped(tensors, *args, **kwargs):
        calls.append(("grouped", kwargs.get("op", args[0] if args else None), len(tensors)))
        return real_grouped(tensors, *args, **kwargs)

    with strategy.scope():
        model = compile_model(build())
        model.optimizer.build(model.trainable_variables)
    strategy_module.collectives.allreduce, strategy_module.collectives.grouped_allreduce = \
        allreduce, grouped
    try:
        model.fit(dataset(x, y), epochs=1, verbose=0)
    finally:
        strategy_module.collectives.allreduce, strategy_module.collectives.grouped_allreduce = \
            real_allreduce, real_grouped
    # Traced once: the four moving statistics in one grouped average, none alone.
    averages = [c for c in calls if c[1] == ddl.Average]
    assert averages == [("grouped", ddl.Average, 4)], calls
    same_on_all_ranks(all_state(model), "state with two BatchNormalization layers")
    # The first layer's statistics: an EMA of the mean over ranks of each
    # rank's batch moments (rank r holds rows [r*B, (r+1)*B) of each batch).
    mean, var = np.zeros(FEATURES), np.ones(FEATURES)
    for step in range(STEPS):
        batch = x[step * GB:(step + 1) * GB].astype(np.float64)
        slices = [batch[r * B:(r + 1) * B] for r in range(size)]
        mean = momentum * mean + (1 - momentum) * np.mean([s.mean(0) for s in slices], 0)
        var = momentum * var + (1 - momentum) * np.mean([s.var(0) for s in slices], 0)
    bn = model.layers[0]
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), var, rtol=1e-5, atol=1e-6)


@case
def save_and_load_a_keras_file():
    seed_differently()
    x, y = data(seed=11)
    with strategy.scope():
        model = compile_model(mlp())
    model.fit(dataset(x, y), epochs=1, verbose=0)
    directory = shared_tmpdir()
    path = os.path.join(directory, "model.keras")
    try:
        if rank == 0:
            model.save(path)
        COMM.Barrier()
        with strategy.scope():
            loaded = keras.models.load_model(path)
        assert loaded.distribute_strategy is strategy
        assert_weights_close(loaded.get_weights(), model.get_weights(), "loaded", rtol=0, atol=0)
        before = [v.numpy() for v in loaded.optimizer.variables]
        np.testing.assert_array_equal(before[0], STEPS)  # iterations restored
        history = loaded.fit(dataset(x, y), epochs=1, verbose=0).history
        model_history = model.fit(dataset(x, y), epochs=1, verbose=0).history
        same_on_all_ranks(loaded.get_weights(), "weights trained after loading")
        same_json_on_all_ranks(history, "history after loading")
        assert_weights_close(loaded.get_weights(), model.get_weights(), "loaded + 1 epoch")
        assert_history_close(history, model_history, "loaded + 1 epoch")
    finally:
        COMM.Barrier()
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)


class CountingCheckpoint(keras.callbacks.ModelCheckpoint):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epochs_seen = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_seen += 1
        super().on_epoch_end(epoch, logs)


class CountingProgbar(keras.callbacks.ProgbarLogger):
    epochs_seen = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs_seen += 1
        super().on_epoch_begin(epoch, logs)


class CountingCallback(keras.callbacks.Callback):
    epochs_seen = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_seen += 1


@case
def progress_bar_and_file_writers_run_on_rank_zero_only():
    seed_differently()
    x, y = data(seed=12)
    directory = shared_tmpdir()
    try:
        with strategy.scope():  # eagerly: replica-context collectives numbered in call order
            model = compile_model(mlp(), run_eagerly=True)
        checkpoint = CountingCheckpoint(os.path.join(directory, "w.weights.h5"),
                                        save_weights_only=True)
        csv_path = os.path.join(directory, "log.csv")
        progbar, counter = CountingProgbar(), CountingCallback()
        model.fit(dataset(x, y), epochs=2, verbose=0,
                  callbacks=[checkpoint, keras.callbacks.CSVLogger(csv_path), progbar, counter])
        assert counter.epochs_seen == 2  # ordinary callbacks run everywhere
        expected = 2 if rank == 0 else 0
        assert (checkpoint.epochs_seen, progbar.epochs_seen) == (expected, expected)
        COMM.Barrier()
        assert os.path.exists(os.path.join(directory, "w.weights.h5"))
        with open(csv_path) as f:
            assert len(f.read().strip().splitlines()) == 3  # header + 2 epochs, one writer

        everywhere = ddl.DDLStrategy(rank_zero_callbacks=False)
        with everywhere.scope():
            model = compile_model(mlp(), run_eagerly=True)
        checkpoint = CountingCheckpoint(os.path.join(directory, f"r{rank}.weights.h5"),
                                        save_weights_only=True)
        model.fit(dataset(x, y), epochs=1, verbose=0, callbacks=[checkpoint])
        assert checkpoint.epochs_seen == 1
    finally:
        COMM.Barrier()
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    run_cases()
