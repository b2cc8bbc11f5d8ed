"""Multi-process checks of the Horovod-parity ops and of the Horovod front
door, against numpy (run by tests/mpi/test_horovod_mpi.py under mpiexec with 2
and 3 ranks)."""

import hashlib

import keras
import numpy as np
import tensorflow as tf
from harness import case, run_cases
from mpi4py import MPI

import keras_ddl as ddl
import keras_ddl.horovod.tensorflow as hvd_tf
import keras_ddl.horovod.tensorflow.keras as hvd

rank = ddl.rank()
size = ddl.size()


def rank_values(r, shape, seed=0, dtype=np.float32):
    """Rank r's small-integer input (sums and binary scalings stay exact)."""
    return np.random.default_rng(100 * seed + r).integers(-4, 5, size=shape).astype(dtype)


def digests_agree(arrays):
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()
    return len(set(MPI.COMM_WORLD.allgather(digest))) == 1


def assert_equal(got, expected, what):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert np.array_equal(got, expected), f"{what}: got {got.ravel()[:6]}, " \
                                          f"expected {expected.ravel()[:6]}"


@case
def allreduce_pre_and_postscale_eager_function_and_gradient():
    x = rank_values(rank, [5])
    inputs = [rank_values(r, [5]) for r in range(size)]
    total = np.sum(inputs, axis=0)
    assert_equal(ddl.allreduce(x, op=ddl.Sum, prescale_factor=2.0, postscale_factor=0.25),
                 total * 0.5, "Sum pre 2 post 0.25")
    assert_equal(hvd_tf.allreduce(x, prescale_factor=4.0, postscale_factor=0.5),
                 (total * 2.0 / size).astype(np.float32), "front door Average pre 4 post 0.5")
    ints = ddl.allreduce(x.astype(np.int32), op=ddl.Sum, prescale_factor=3.0)
    assert_equal(ints, (total * 3).astype(np.int32), "int32 Sum pre 3")

    @tf.function
    def grouped(a, b):
        return ddl.grouped_allreduce([a, b], op=ddl.Sum, prescale_factor=0.5,
                                     postscale_factor=8.0)

    single = tf.function(lambda t: ddl.allreduce(t, op=ddl.Average, prescale_factor=2.0,
                                                 postscale_factor=0.5))
    assert_equal(single(tf.constant(x)), (total / size).astype(np.float32), "allreduce in tf.function")
    a, b = grouped(tf.constant(x), tf.constant(2 * x))
    assert_equal(a, total * 4.0, "grouped in tf.function [0]")
    assert_equal(b, total * 8.0, "grouped in tf.function [1]")

    # d(sum over ranks of sum(w_r * y))/dx = pre * post * sum_r w_r
    weights = [rank_values(r, [5], seed=1) for r in range(size)]
    variable = tf.Variable(x)
    with tf.GradientTape() as tape:
        y = ddl.allreduce(variable, op=ddl.Sum, prescale_factor=2.0, postscale_factor=0.5)
        loss = tf.reduce_sum(y * weights[rank])
    grad = tape.gradient(loss, variable)
    assert_equal(grad, np.sum(weights, axis=0) * 1.0, "allreduce gradient with factors")
    with tf.GradientTape() as tape:
        y = ddl.grouped_allreduce([variable], op=ddl.Sum, prescale_factor=4.0)[0]
        loss = tf.reduce_sum(y * weights[rank])
    assert_equal(tape.gradient(loss, variable), np.sum(weights, axis=0) * 4.0,
                 "grouped_allreduce gradient with prescale")


def rows(r):
    return r % 2 + 1  # first dimensions differ between ranks


@case
def grouped_allgather_eager_function_and_gradient():
    mine = [rank_values(rank, [rows(rank), 3]), rank_values(rank, [2], seed=2).astype(np.int32)]
    expected = [np.concatenate([rank_values(r, [rows(r), 3]) for r in range(size)]),
                np.concatenate([rank_values(r, [2], seed=2).astype(np.int32)
                                for r in range(size)])]
    for got, want, what in zip(ddl.grouped_allgather(mine), expected, ("float", "int")):
        assert_equal(got, want, f"eager grouped_allgather {what}")
    traced = tf.function(lambda a, b: hvd_tf.grouped_allgather([a, b]))
    for got, want, what in zip(traced(*mine), expected, ("float", "int")):
        assert_equal(got, want, f"tf.function grouped_allgather {what}")

    # d(sum over ranks of sum(W_r * gathered))/d(my rows) = my rows of sum_r W_r.
    total_rows = sum(rows(r) for r in range(size))
    weights = [rank_values(r, [total_rows, 3], seed=3) for r in range(size)]
    start = sum(rows(r) for r in range(rank))
    variable = tf.Variable(mine[0])
    with tf.GradientTape() as tape:
        gathered = ddl.grouped_allgather([variable])[0]
        loss = tf.reduce_sum(gathered * weights[rank])
    assert_equal(tape.gradient(loss, variable),
                 np.sum(weights, axis=0)[start:start + rows(rank)], "grouped_allgather gradient")


def block(r, total):
    """Rank r's rows of a reducescatter of `total` rows."""
    base, extra = divmod(total, size)
    start = r * base + min(r, extra)
    return slice(start, start + base + (1 if r < extra else 0))


@case
def grouped_reducescatter_eager_function_and_gradient():
    shapes = [[7, 2], [size * 2]]
    mine = [rank_values(rank, s, seed=i) for i, s in enumerate(shapes)]
    totals = [np.sum([rank_values(r, s, seed=i) for r in range(size)], axis=0)
              for i, s in enumerate(shapes)]
    got = ddl.grouped_reducescatter(mine, op=ddl.Sum, postscale_factor=2.0)
    for g, t, s in zip(got, totals, shapes):
        assert_equal(g, 2.0 * t[block(rank, s[0])], f"eager grouped_reducescatter {s}")
    # The front door's default op is Average, as Horovod's.
    traced = tf.function(lambda a, b: hvd_tf.grouped_reducescatter([a, b]))
    for g, t, s in zip(traced(*mine), totals, shapes):
        assert_equal(g, (t / size).astype(np.float32)[block(rank, s[0])],
                     f"tf.function front-door grouped_reducescatter {s}")
    assert_equal(hvd.reducescatter(mine[0]), (totals[0] / size).astype(np.float32)[block(rank, 7)],
                 "keras front door reducescatter (Average)")

    # d(sum over ranks of sum(w_r * my block))/dx = the concatenation of every w_r.
    weights = [rank_values(r, [len(range(7)[block(r, 7)]), 2], seed=5) for r in range(size)]
    variable = tf.Variable(mine[0])
    with tf.GradientTape() as tape:
        part = ddl.grouped_reducescatter([variable], op=ddl.Sum, prescale_factor=2.0)[0]
        loss = tf.reduce_sum(part * weights[rank])
    assert_equal(tape.gradient(loss, variable), 2.0 * np.concatenate(weights),
                 "grouped_reducescatter gradient")


@case
def rank_and_size_ops_in_tf_function():
    @tf.function
    def read():
        return (ddl.rank_op(), ddl.size_op(), ddl.local_rank_op(), ddl.local_size_op(),
                hvd_tf.size_op(), hvd_tf.rank_op())

    values = [int(v) for v in read()]
    assert values == [rank, size, ddl.local_rank(), ddl.local_size(), size, rank], values
    assert all(v.dtype == tf.int32 for v in read())


@case
def broadcast_object_and_allgather_object():
    arrays = {"w": np.arange(6.0).reshape(2, 3) + rank, "step": np.int64(7 + rank)}
    got = ddl.broadcast_object(arrays if rank == 0 else None, root_rank=0)
    assert set(got) == {"w", "step"} and np.array_equal(got["w"], np.arange(6.0).reshape(2, 3))
    assert got["step"] == 7
    last = size - 1
    assert hvd.broadcast_object(f"from {rank}", root_rank=last) == f"from {last}"
    assert ddl.broadcast_object(None, root_rank=0) is None
    fn = hvd_tf.broadcast_object_fn(root_rank=0)
    assert fn([rank, "x"]) == [0, "x"]
    gathered = ddl.allgather_object({"rank": rank, "a": np.full(rank + 1, rank)})
    assert [g["rank"] for g in gathered] == list(range(size))
    assert all(np.array_equal(g["a"], np.full(r + 1, r)) for r, g in enumerate(gathered))
    assert hvd.allgather_object("s" * rank) == ["s" * r for r in range(size)]
    assert ddl.allgather_object(None) == [None] * size
    # An object one rank cannot pickle fails every rank, naming it, and
    # the collectives after it still pair up.
    unpicklable = lambda: None  # noqa: E731
    for call, words in (
            (lambda: ddl.broadcast_object(unpicklable if rank == last else 1, root_rank=last,
                                          name="obj.bad"), f"root rank {last} cannot pickle"),
            (lambda: ddl.allgather_object(unpicklable if rank == 0 else rank, name="obj.bad2"),
             "rank(s) [0] cannot pickle")):
        try:
            call()
        except TypeError as e:
            assert words in str(e) and f"rank {rank}" in str(e), e
        else:
            raise AssertionError(f"no error on rank {rank}: {words}")
    assert ddl.broadcast_object("after", root_rank=0) == "after"


@case
def broadcast_in_place_eager_and_in_function():
    variables = [tf.Variable(np.full([3], rank, np.float32)), tf.Variable(np.int32(rank + 10))]
    values = ddl.broadcast_(variables, root_rank=size - 1)
    assert_equal(variables[0].numpy(), np.full([3], size - 1, np.float32), "eager broadcast_ f32")
    assert int(variables[1].numpy()) == size + 9 and int(values[1]) == size + 9
    keras_variable = keras.Variable(np.full([2], rank, np.float32))
    tf.function(lambda: hvd_tf.broadcast_([keras_variable], 0, name="bcast_fn"))()
    assert_equal(keras_variable.numpy(), np.zeros([2], np.float32), "broadcast_ in tf.function")
    try:
        hvd.broadcast_global_variables(0)
    except RuntimeError as e:
        assert "broadcast_variables" in str(e), e
    else:
        raise AssertionError("broadcast_global_variables did not raise")


@case
def grouped_allreduce_indexed_slices():
    values = rank_values(rank, [2, 3])
    indices = np.array([rank, rank + 1], np.int32)
    dense_shape = [size + 1, 3]
    slices = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant(dense_shape))
    dense_in = rank_values(rank, [4], seed=9)
    out = ddl.grouped_allreduce([dense_in, slices], op=ddl.Average)
    assert isinstance(out[1], tf.IndexedSlices), type(out[1])
    all_values = np.concatenate([rank_values(r, [2, 3]) for r in range(size)])
    assert_equal(out[1].values, (all_values / size).astype(np.float32), "gathered values")
    assert_equal(out[1].indices, np.concatenate([[r, r + 1] for r in range(size)]).astype(np.int32),
                 "gathered indices")
    assert_equal(out[0], (np.sum([rank_values(r, [4], seed=9) for r in range(size)], axis=0)
                          / size).astype(np.float32), "dense member")
    reference = np.zeros(dense_shape, np.float32)
    for r in range(size):
        np.add.at(reference, [r, r + 1], rank_values(r, [2, 3]))
    # keras_ddl's own API scales slices (Horovod's refuses: see
    # front_door_indexed_slices_errors_as_horovod).
    scaled = ddl.allreduce(slices, op=ddl.Sum, prescale_factor=2.0, postscale_factor=0.25)
    assert isinstance(scaled, tf.IndexedSlices), type(scaled)
    assert_equal(scaled.values, all_values * 0.5, "slices with pre and post factors")
    traced = tf.function(lambda v, i: ddl.grouped_allreduce(
        [tf.IndexedSlices(v, i, tf.constant(dense_shape))], op=ddl.Average)[0])
    in_function = traced(tf.constant(values), tf.constant(indices))
    assert_equal(in_function.values, (all_values / size).astype(np.float32),
                 "gathered values in tf.function")
    dense = hvd_tf.grouped_allreduce([slices], op=hvd.Sum)[0]
    assert_equal(tf.convert_to_tensor(dense), reference, "slices summed, densified after")
    as_dense = ddl.grouped_allreduce([slices], op=ddl.Sum, sparse_as_dense=True)[0]
    assert_equal(as_dense, reference, "sparse_as_dense")
    try:
        ddl.grouped_allreduce([tf.IndexedSlices(tf.constant(values), tf.constant(indices))],
                              sparse_as_dense=True)
    except ValueError as e:
        assert "tensors[0]" in str(e) and "dense_shape" in str(e) and f"rank {rank}" in str(e), e
    else:
        raise AssertionError("an IndexedSlices without dense_shape was densified")


def global_batch(channels_shape, seed):
    """Every rank's batch (rank r has r + 2 rows) and the concatenation."""
    batches = [np.random.default_rng(seed + r).normal(1.0 + r, 2.0, size=[r + 2, *channels_shape])
               .astype(np.float32) for r in range(size)]
    return batches, np.concatenate(batches)


def check_sync_batch_norm(channels_shape, traced, **layer_kwargs):
    batches, everything = global_batch(channels_shape, seed=20)
    out_weights = [np.random.default_rng(50 + r).normal(size=b.shape).astype(np.float32)
                   for r, b in enumerate(batches)]
    sync = hvd.SyncBatchNormalization(momentum=0.5, epsilon=1e-3, **layer_kwargs)
    plain = keras.layers.BatchNormalization(momentum=0.5, epsilon=1e-3)
    for layer in (sync, plain):
        layer.build(everything.shape)
        layer.gamma.assign(np.linspace(0.5, 1.5, channels_shape[-1]))
        layer.beta.assign(np.linspace(-1, 1, channels_shape[-1]))

    def forward(layer, x, weights):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * weights)
        return (y, *tape.gradient(loss, [x, layer.gamma, layer.beta]))

    sync_step = tf.function(forward) if traced else forward
    y, dx, dgamma, dbeta = sync_step(sync, tf.constant(batches[rank]),
                                     tf.constant(out_weights[rank]))
    ry, rdx, rdgamma, rdbeta = forward(plain, tf.constant(everything),
                                       tf.constant(np.concatenate(out_weights)))
    mine = slice(sum(r + 2 for r in range(rank)), sum(r + 2 for r in range(rank + 1)))
    tolerance = dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y.numpy(), ry.numpy()[mine], **tolerance, err_msg="output")
    np.testing.assert_allclose(dx.numpy(), rdx.numpy()[mine], **tolerance, err_msg="d/dx")
    # gamma and beta get this rank's share; their sum over ranks is the reference.
    np.testing.assert_allclose(ddl.allreduce(dgamma, op=ddl.Sum), rdgamma, **tolerance,
                               err_msg="d/dgamma")
    np.testing.assert_allclose(ddl.allreduce(dbeta, op=ddl.Sum), rdbeta, **tolerance,
                               err_msg="d/dbeta")
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(getattr(sync, name).numpy(), getattr(plain, name).numpy(),
                                   rtol=1e-5, atol=1e-5, err_msg=name)
    inference = sync(tf.constant(batches[rank]), training=False)
    np.testing.assert_allclose(inference, plain(tf.constant(batches[rank]), training=False),
                               rtol=1e-5, atol=1e-5, err_msg="inference")


@case
def sync_batch_norm_equals_batch_norm_on_the_global_batch():
    check_sync_batch_norm([4], traced=False)


@case
def sync_batch_norm_images_in_tf_function():
    check_sync_batch_norm([3, 3, 2], traced=True)


def two_layer_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input([4])
    hidden = keras.layers.Dense(3, name="shared")(inputs)
    outputs = keras.layers.Dense(2, name="local_head")(hidden)
    return keras.Model(inputs, outputs)


@case
def partial_distributed_optimizer_keeps_local_layers_per_rank():
    model = two_layer_model(seed=0)  # the same start everywhere
    head = model.get_layer("local_head")
    optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.05), local_layers=[head])
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    x = np.random.default_rng(rank).normal(size=[16, 4]).astype(np.float32)
    y = np.random.default_rng(10 + rank).normal(size=[16, 2]).astype(np.float32)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert digests_agree(model.get_layer("shared").get_weights()), \
        "the shared layer differs between ranks"
    assert not digests_agree(head.get_weights()), "the local head is the same on every rank"


@case
def broadcast_callback_skips_local_variables():
    model = two_layer_model(seed=rank)  # every rank starts different
    head = model.get_layer("local_head")
    before = [w.copy() for w in head.get_weights()]
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(
        0, local_variables=head.trainable_weights)
    callback.set_model(model)
    callback.on_train_begin()
    assert digests_agree(model.get_layer("shared").get_weights()), "shared not broadcast"
    for w, b in zip(head.get_weights(), before):
        assert_equal(w, b, "a local variable was overwritten")


@case
def partial_tape_scales_and_skips_local_gradients():
    model = two_layer_model(seed=rank)
    ddl.broadcast_variables(model.get_layer("shared").trainable_weights, root_rank=0)
    head = model.get_layer("local_head")
    x = tf.constant(rank_values(rank, [3, 4]))

    def gradients(wrap):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x)))
        return wrap(tape).gradient(loss, model.trainable_variables)

    plain = gradients(lambda tape: tape)
    partial = gradients(lambda tape: hvd_tf.PartialDistributedGradientTape(
        tape, local_layers=head))
    for variable, p, g in zip(model.trainable_variables, plain, partial):
        if any(variable is w for w in head.trainable_weights):
            np.testing.assert_allclose(g, p / size, rtol=1e-6, err_msg=variable.path)
        else:
            np.testing.assert_allclose(g, ddl.allreduce(p), rtol=1e-6, err_msg=variable.path)
    traced = tf.function(lambda: gradients(lambda tape: ddl.PartialDistributedGradientTape(
        tape, local_layers=[head])))()
    for p, t in zip(partial, traced):
        np.testing.assert_allclose(t, p, rtol=1e-6, err_msg="partial tape in tf.function")
    unscaled = gradients(lambda tape: ddl.PartialDistributedGradientTape(
        tape, local_layers=head, scale_local_gradients=False))
    np.testing.assert_allclose(unscaled[-1], plain[-1], rtol=1e-6, err_msg="unscaled local")


@case
def backward_passes_per_step_sums_or_averages():
    for average in (False, True):
        variable = keras.Variable(np.zeros([2], np.float32))
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                                             average_aggregated_gradients=average)
        grads = [rank_values(rank, [2], seed=s) for s in (30, 31)]
        optimizer.apply([tf.constant(grads[0])], [variable])
        assert_equal(variable.numpy(), np.zeros([2], np.float32), "no update after pass 1")
        optimizer.apply([tf.constant(grads[1])], [variable])
        summed = np.mean([rank_values(r, [2], seed=30) + rank_values(r, [2], seed=31)
                          for r in range(size)], axis=0)
        expected = -(summed / 2 if average else summed)
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6,
                                   err_msg=f"average_aggregated_gradients={average}")


@case
def front_door_arguments_map_or_refuse():
    x = tf.constant(rank_values(rank, [3]))
    total = np.sum([rank_values(r, [3]) for r in range(size)], axis=0)
    assert_equal(hvd.allreduce(x, average=False), total, "average=False is Sum")
    assert_equal(hvd_tf.allreduce(x, device_dense="/gpu:0", ignore_name_scope=True, op=hvd.Sum),
                 total, "ignored arguments")
    hvd.init(comm=MPI.COMM_WORLD)
    assert hvd.is_initialized() and hvd.is_homogeneous() and hvd.mpi_threads_supported()
    refusals = [
        ("Adasum", lambda: hvd_tf.allreduce(x, op=hvd.Adasum)),
        ("groups", lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), groups=2)),
        ("comm", lambda: hvd.init(comm=[0])),
        ("start_timeline", lambda: hvd.start_timeline("/tmp/t.json")),
    ]
    for word, call in refusals:
        try:
            call()
        except NotImplementedError as e:
            assert word in str(e), (word, str(e))
        else:
            raise AssertionError(f"{word}: no NotImplementedError")
    # alltoall through the front door: rank r sends r + 1 rows to each rank
    # (values 10 * r + destination), Horovod's return convention.
    rows = np.repeat(np.arange(size), rank + 1).astype(np.float32) + 10 * rank
    out, received = hvd.alltoall(tf.constant(rows), splits=[rank + 1] * size, name="hvd.a2a")
    want = np.concatenate([np.full(r + 1, 10 * r + rank, np.float32) for r in range(size)])
    assert_equal(out, want, "hvd.alltoall output")
    assert_equal(received, np.arange(1, size + 1, dtype=np.int32), "hvd.alltoall received splits")
    assert_equal(hvd.alltoall(tf.constant(np.arange(size, dtype=np.float32)), name="hvd.a2a.even"),
                 np.full(size, rank, np.float32), "hvd.alltoall without splits: the tensor")
    assert_equal(hvd_tf.allreduce(x, op=hvd.Sum, process_set=hvd.global_process_set), total,
                 "process_set=global_process_set")


def expect_error(call, error, words, what):
    """Asserts `call()` raises `error` with every one of `words` in its message."""
    try:
        call()
    except error as e:
        assert all(w in str(e) for w in words), (what, str(e))
    else:
        raise AssertionError(f"{what}: no {error.__name__} on rank {rank}")


def set_block(index, set_size, total):
    """Set member `index`'s rows of a reducescatter of `total` rows over `set_size` ranks."""
    base, extra = divmod(total, set_size)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def check_set_collectives(ps, members):
    """Every front-door collective over `ps` (this rank is one of `members`,
    its world ranks) against numpy; `root_rank` is a world rank."""
    me, n = members.index(rank), len(members)
    assert (ps.included(), ps.rank(), ps.size()) == (True, me, n)
    assert int(hvd_tf.size_op(process_set_id=ps.process_set_id)) == n
    assert int(hvd_tf.process_set_included_op(ps.process_set_id)) == 1
    x = rank_values(rank, [4, 3], seed=40)
    inputs = [rank_values(r, [4, 3], seed=40) for r in members]
    total = np.sum(inputs, axis=0)
    assert_equal(hvd_tf.allreduce(x, op=hvd.Sum, process_set=ps), total, "set allreduce Sum")
    assert_equal(hvd_tf.allreduce(x, process_set=ps), (total / n).astype(np.float32),
                 "set allreduce Average (the default)")
    # Named: an unnamed collective traced by the members only would shift
    # keras_ddl.ops.auto_name's process-wide graph numbering on them, so the
    # next unnamed collective traced by every rank would not pair up.
    traced = tf.function(lambda t: hvd_tf.allreduce(t, average=False, process_set=ps,
                                                    name="set.traced.allreduce"))
    assert_equal(traced(tf.constant(x)), total, "set allreduce Sum in tf.function")
    a, b = hvd_tf.grouped_allreduce([x, 2 * x], op=hvd.Sum, process_set=ps)
    assert_equal(a, total, "set grouped_allreduce [0]")
    assert_equal(b, 2 * total, "set grouped_allreduce [1]")
    mine = rank_values(rank, [rows(rank), 2], seed=41)
    gathered = np.concatenate([rank_values(r, [rows(r), 2], seed=41) for r in members])
    assert_equal(hvd_tf.allgather(mine, process_set=ps), gathered, "set allgather")
    assert_equal(hvd_tf.grouped_allgather([mine], process_set=ps)[0], gathered,
                 "set grouped_allgather")
    root = members[-1]
    assert_equal(hvd_tf.broadcast(x, root_rank=root, process_set=ps),
                 rank_values(root, [4, 3], seed=40), f"set broadcast from world rank {root}")
    outsider = next(r for r in range(size + 1) if r not in members)
    expect_error(lambda: hvd_tf.broadcast(x, root_rank=outsider, process_set=ps), ValueError,
                 [f"root_rank={outsider}", "not in", f"rank {rank}"], "root outside the set")
    for op, divisor in ((hvd.Sum, 1), (hvd.Average, n)):
        got = hvd_tf.reducescatter(x, op=op, process_set=ps)
        assert_equal(got, (total / np.float32(divisor))[set_block(me, n, 4)],
                     f"set reducescatter {op.name}")
    got = hvd_tf.grouped_reducescatter([x], op=hvd.Sum, process_set=ps)[0]
    assert_equal(got, total[set_block(me, n, 4)], "set grouped_reducescatter")
    sent = np.repeat(np.array(members, np.float32), me + 1) + 10 * rank
    out, received = hvd_tf.alltoall(sent, splits=[me + 1] * n, process_set=ps)
    want = np.concatenate([np.full(i + 1, 10 * r + rank, np.float32)
                           for i, r in enumerate(members)])
    assert_equal(out, want, "set alltoall")
    assert_equal(received, np.arange(1, n + 1, dtype=np.int32), "set alltoall received splits")
    variables = [tf.Variable(np.full([2], rank, np.float32)), tf.Variable(np.int32(rank))]
    hvd_tf.broadcast_variables(variables, root_rank=root, process_set=ps)
    assert_equal(variables[0].numpy(), np.full([2], root, np.float32), "set broadcast_variables")
    assert int(variables[1].numpy()) == root, "set broadcast_variables int32"
    variables[0].assign(np.full([2], rank, np.float32))
    values = hvd_tf.broadcast_(variables[:1], root_rank=members[0], process_set=ps)
    assert_equal(values[0], np.full([2], members[0], np.float32), "set broadcast_")
    assert hvd_tf.broadcast_object(f"from {rank}", root_rank=root, process_set=ps) == \
        f"from {root}"
    assert hvd_tf.allgather_object({"r": rank}, process_set=ps) == [{"r": r} for r in members]
    fn = hvd_tf.broadcast_object_fn(root_rank=root, process_set=ps)
    assert fn(rank * 3) == root * 3


@case
def front_door_process_set_without_rank_1():
    """Every rank but 1 (ranks 0 and 2 at 3 ranks; rank 0 alone at 2 ranks),
    registered by hvd.init(process_sets=...), runs every front-door
    collective among itself while rank 1 runs its own set's collective
    (or a local computation); rank 1 is refused the others' set."""
    members = [r for r in range(size) if r != 1]
    others, alone = hvd.ProcessSet(members), hvd.ProcessSet([1])
    hvd.init(process_sets=[others, alone])
    assert others.process_set_id not in (None, 0) and alone.process_set_id not in (None, 0)
    hvd.init(process_sets=[others, alone])  # registered sets are skipped, not added again
    if rank in members:
        check_set_collectives(others, members)
    else:
        local = np.linalg.matrix_power(np.array([[1.0, 1.0], [0.0, 1.0]]), 5)
        assert local[0, 1] == 5.0  # work of its own meanwhile
        assert_equal(hvd_tf.allreduce([3.0, 4.0], op=hvd.Sum, process_set=alone),
                     np.array([3.0, 4.0], np.float32), "a set of one rank")
        assert others.included() is False
        assert int(hvd_tf.process_set_included_op(others.process_set_id)) == 0
        expect_error(lambda: others.rank(), ValueError, ["rank 1", "not in"], "rank() outside")
        for name, call in (
                ("allreduce", lambda: hvd_tf.allreduce([1.0], process_set=others)),
                ("broadcast_object", lambda: hvd_tf.broadcast_object(1, 0, process_set=others)),
                ("alltoall", lambda: hvd.alltoall([1.0], process_set=others))):
            expect_error(call, ValueError, [f"{name}(process_set=", "rank 1 is not in the set"],
                         f"{name} outside the set")
    # The world's collectives still pair up afterwards.
    assert_equal(hvd_tf.allreduce([1.0], op=hvd.Sum, name="after.sets"),
                 np.array([size], np.float32), "world allreduce after the sets")
    assert hvd.remove_process_set(others) is True and others.process_set_id is None
    assert hvd.remove_process_set(alone) is True


@case
def front_door_process_set_of_every_rank_and_removal():
    everyone = hvd.add_process_set(list(range(size)))
    assert isinstance(everyone, hvd.ProcessSet) and everyone.process_set_id not in (None, 0)
    check_set_collectives(everyone, list(range(size)))
    # A set of one rank, added from a ProcessSet; every rank registers it.
    first = hvd.add_process_set(hvd.ProcessSet([0]))
    if rank == 0:
        check_set_collectives(first, [0])
    x = tf.constant([1.0, 2.0])
    expect_error(lambda: hvd_tf.allreduce(x, process_set=hvd.ProcessSet(range(size))), ValueError,
                 ["not registered", f"rank {rank}"], "an unregistered set")
    expect_error(lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=everyone),
                 NotImplementedError, ["DistributedOptimizer(process_set="], "optimizer over a set")
    assert hvd.remove_process_set(everyone) is True
    assert everyone.process_set_id is None and everyone.size() is None
    expect_error(lambda: hvd_tf.allgather(x, process_set=everyone), ValueError,
                 ["allgather(process_set=", "removed"], "a removed set")
    assert hvd.remove_process_set(everyone) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False
    assert hvd.remove_process_set(first) is True
    # Re-adding the ranks of a removed set registers a new one.
    again = hvd.add_process_set(everyone)
    assert again is everyone and everyone.process_set_id not in (None, 0)
    assert_equal(hvd_tf.allreduce(x, op=hvd.Sum, process_set=everyone), x.numpy() * size,
                 "a set added again")
    # A communicator is a ProcessSet of its processes' world ranks.
    halves = MPI.COMM_WORLD.Split(color=rank % 2, key=-rank)
    assert hvd.ProcessSet(halves).ranks == [r for r in range(size) if r % 2 == rank % 2]
    halves.Free()


# --- Issue #31: the front door computes and raises what Horovod does -------

def both_ways(check):
    """Runs `check(run)` eagerly and with every front-door call traced in a
    tf.function (`run(fn)` calls `fn()` either way)."""
    check(lambda fn: fn())
    check(lambda fn: tf.function(fn)())


def expect_all(call, error, words, what):
    """`expect_error` that also names the class it got when it is another."""
    try:
        call()
    except error as e:
        assert all(w in str(e) for w in words), (what, str(e))
    except Exception as e:  # noqa: BLE001 - the wrong class is the failure
        raise AssertionError(f"{what}: {type(e).__name__} instead of {error.__name__} on rank "
                             f"{rank}: {e}") from None
    else:
        raise AssertionError(f"{what}: no {error.__name__} on rank {rank}")


@case
def front_door_mismatch_is_failed_precondition():
    """Ranks that disagree on shape, dtype or root fail every rank with
    Horovod's FailedPreconditionError, eagerly and in tf.function."""
    step = iter(range(100))

    def check(run):
        k = next(step)
        attempts = {
            "shape": lambda: hvd_tf.allreduce(tf.ones([2 + rank % 2]), op=hvd.Sum,
                                              name=f"hvd.mm.shape.{k}"),
            "dtype": lambda: hvd_tf.allgather(tf.ones([2], tf.int32 if rank == 0 else tf.float32),
                                              name=f"hvd.mm.dtype.{k}"),
            "root_rank": lambda: hvd_tf.broadcast(tf.ones([2]), root_rank=0 if rank == 0 else 1,
                                                  name=f"hvd.mm.root.{k}"),
        }
        for what, call in attempts.items():
            expect_all(lambda: run(call), tf.errors.FailedPreconditionError,
                       [what, "hvd.mm.", f"rank {rank}"], f"mismatched {what}")
    both_ways(check)
    # The engine goes on afterwards.
    assert_equal(hvd_tf.allreduce([1.0], op=hvd.Sum, name="hvd.mm.after"),
                 np.array([size], np.float32), "after the mismatches")


def horovod_int_result(inputs, dtype, op, pre, post, n):
    """What Horovod computes on integers: float32 factors, each input scaled
    in float64 and truncated, the sum in the dtype (wrapping), then the
    result scaled by post (divided by n for Average) in float64, truncated."""
    pre32, post32 = float(np.float32(pre)), float(np.float32(post))
    scaled = [(x.astype(np.float64) * pre32).astype(dtype) for x in inputs]
    total = np.sum(scaled, axis=0, dtype=dtype)
    factor = post32 / n if op == hvd.Average else post32
    return (total.astype(np.float64) * factor).astype(dtype)


@case
def front_door_integer_average_and_factors_as_horovod():
    # 10 * float32(0.7) = 6.99999988: Horovod truncates it to 6, where a
    # float64 factor gives 7; the sums stay inside int8 and uint8.
    def mine(r):
        return np.array([10, 3, 7 + r, 1, 2 * r], np.int64)
    step = iter(range(100))

    combos = [(dtype, op, pre, post) for dtype in (np.uint8, np.int8, np.int32, np.int64)
              for op, pre, post in ((hvd.Average, 1.0, 1.0), (hvd.Sum, 0.7, 1.0),
                                    (hvd.Sum, 1.0, 0.7), (hvd.Average, 0.7, 1.5))]

    def calls():
        """Every reduction of the check, in one function (traced once)."""
        out = [hvd_tf.allreduce(tf.constant(mine(rank).astype(dtype)), op=op,
                                prescale_factor=pre, postscale_factor=post)
               for dtype, op, pre, post in combos]
        for dtype in (np.uint8, np.int32):
            x = tf.constant(mine(rank).astype(dtype))
            out.extend(hvd_tf.grouped_allreduce([x, 2 * x], op=hvd.Average))
        return out

    def check(run):
        k = next(step)
        got = run(calls)
        for result, (dtype, op, pre, post) in zip(got, combos):
            inputs = [mine(r).astype(dtype) for r in range(size)]
            assert_equal(result, horovod_int_result(inputs, dtype, op, pre, post, size),
                         f"{np.dtype(dtype).name} {op.name} pre {pre} post {post} ({k})")
        for i, dtype in enumerate((np.uint8, np.int32)):
            inputs = [mine(r).astype(dtype) for r in range(size)]
            a, b = got[len(combos) + 2 * i:len(combos) + 2 * i + 2]
            assert_equal(a, horovod_int_result(inputs, dtype, hvd.Average, 1, 1, size),
                         "grouped int Average [0]")
            assert_equal(b, horovod_int_result([2 * x for x in inputs], dtype, hvd.Average,
                                               1, 1, size), "grouped int Average [1]")
        rows = np.arange(size * 2, dtype=np.int32) * (rank + 1)
        got = run(lambda: hvd_tf.reducescatter(tf.constant(rows)))  # Average by default
        every = [np.arange(size * 2, dtype=np.int32) * (r + 1) for r in range(size)]
        assert_equal(got, horovod_int_result(every, np.int32, hvd.Average, 1, 1, size)
                     [block(rank, 2 * size)], "reducescatter int32 Average")
        # bool is no integer: its Average stays refused, on every rank.
        expect_all(lambda: run(lambda: hvd_tf.allreduce(tf.constant([True]), op=hvd.Average,
                                                        name=f"hvd.bool_average.{k}")),
                   tf.errors.InvalidArgumentError, ["op=Average", f"rank {rank}"], "bool Average")
        # IndexedSlices: Average divides with /, so int32 values come back float64.
        values = np.array([[rank + 1, 2]], np.int32)
        slices = run(lambda: hvd_tf.allreduce(tf.IndexedSlices(tf.constant(values),
                                                               tf.constant([rank]))))
        want = np.concatenate([[[r + 1, 2]] for r in range(size)]).astype(np.float64) / size
        assert_equal(slices.values, want, "IndexedSlices int32 Average")
    both_ways(check)


@case
def front_door_indexed_slices_errors_as_horovod():
    slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([rank]), tf.constant([size, 2]))

    def check(run):
        for op in (hvd.Min, hvd.Max, hvd.Product):
            expect_all(lambda: run(lambda: hvd_tf.allreduce(slices, op=op)), NotImplementedError,
                       [f"op={op.name}", "Sum and Average", "tensor", f"rank {rank}"],
                       f"IndexedSlices {op.name}")
        expect_all(lambda: run(lambda: hvd_tf.grouped_allreduce([tf.ones([2]), slices],
                                                                op=hvd.Max)),
                   NotImplementedError, ["op=Max", "tensors[1]", f"rank {rank}"],
                   "grouped IndexedSlices Max")
        for factors in (dict(prescale_factor=2.0), dict(postscale_factor=0.5)):
            expect_all(lambda: run(lambda: hvd_tf.allreduce(slices, op=hvd.Sum, **factors)),
                       NotImplementedError, ["prescale_factor", "IndexedSlices", f"rank {rank}"],
                       f"IndexedSlices {factors}")
    both_ways(check)
    # Nothing was sent: the next collective pairs up.
    assert_equal(hvd_tf.allreduce([1.0], op=hvd.Sum, name="hvd.slices.after"),
                 np.array([size], np.float32), "after the refusals")


def gradient_of(run, forward, variable, upstream):
    """d(sum(forward(variable) * upstream))/d(variable), eagerly or traced."""
    def grad():
        with tf.GradientTape() as tape:
            out = forward(variable)
        return tape.gradient(out, variable, output_gradients=tf.constant(upstream))
    return run(grad)


@case
def front_door_gradients_are_horovods():
    """allgather/grouped_allgather (rank-dependent rows), broadcast and
    (grouped_)reducescatter gradients as Horovod defines them, eagerly and in
    tf.function, with several float dtypes and dimensions in one function
    (Horovod's own check, which stalled before)."""
    sizes = [3, 2, 7][:size]

    def check(run):
        for dtype, dim in ((np.float32, 1), (np.float64, 2), (np.float32, 3)):
            tail = [5] * (dim - 1)
            v = tf.Variable(np.full([sizes[rank], *tail], rank, dtype))
            ups = [np.concatenate([np.full([s, *tail], 10 * q + r, dtype)
                                   for r, s in enumerate(sizes)]) for q in range(size)]
            start = sum(sizes[:rank])
            mean = np.mean(ups, axis=0).astype(dtype)
            assert_equal(gradient_of(run, lambda t: hvd_tf.allgather(t), v, ups[rank]),
                         mean[start:start + sizes[rank]], f"allgather grad {dim}d")
            assert_equal(gradient_of(run, lambda t: hvd_tf.grouped_allgather([t])[0], v,
                                     ups[rank]),
                         mean[start:start + sizes[rank]], f"grouped_allgather grad {dim}d")
            w = tf.Variable(np.full([2, *tail], rank, dtype))
            ups = [np.full([2, *tail], q + 1, dtype) for q in range(size)]
            want = np.mean(ups, axis=0).astype(dtype) if rank == size - 1 else \
                np.zeros([2, *tail], dtype)
            assert_equal(gradient_of(run, lambda t: hvd_tf.broadcast(t, size - 1), w, ups[rank]),
                         want, f"broadcast grad {dim}d")
            x = tf.Variable(np.ones([size * 2, *tail], dtype))
            ups = [np.full([2, *tail], q + 1, dtype) for q in range(size)]
            for op, factor in ((hvd.Sum, size), (hvd.Average, 1)):
                want = np.concatenate(ups) * dtype(factor)
                assert_equal(gradient_of(run, lambda t: hvd_tf.reducescatter(t, op=op), x,
                                         ups[rank]), want, f"reducescatter {op.name} grad")
                # Horovod's gradient leaves the factors out.
                assert_equal(gradient_of(run, lambda t: hvd_tf.grouped_reducescatter(
                    [t], op=op, prescale_factor=2.0, postscale_factor=0.5)[0], x, ups[rank]),
                    want, f"grouped_reducescatter {op.name} grad with factors")
    both_ways(check)


@case
def gradients_of_rank_dependent_rows_pair_up_in_a_graph():
    """keras_ddl's own allgather gradients with rank-dependent rows, several
    in one TF1-style graph and in one tf.function (Horovod's allgather
    gradient check, through keras_ddl's API): each gradient collective is
    named after its forward one, and the row offset is not a slice that a
    graph optimiser could fold away on rank 0 alone."""
    sizes = [3, 2, 7][:size]

    def gradients(differentiate):
        out = []
        for dim in (1, 2, 3):
            t = tf.ones([sizes[rank]] + [4] * (dim - 1)) * rank
            up = tf.concat([tf.ones([s] + [4] * (dim - 1)) * r for r, s in enumerate(sizes)], 0)
            out.append(tf.reduce_sum(differentiate(t, up)))
        return out

    def in_graph(t, up):
        return tf.gradients(ddl.allgather(t), t, up)[0]

    def taped(t, up):
        with tf.GradientTape() as tape:
            tape.watch(t)
            gathered = ddl.allgather(t)
        return tape.gradient(gathered, t, up)

    with tf.Graph().as_default():
        sums = gradients(in_graph)
        # The name's constant sits behind a PlaceholderWithDefault (no folding).
        names = [op.inputs[-1].op.inputs[0].op.get_attr("value").string_val[0].decode()
                 for op in tf.compat.v1.get_default_graph().get_operations()
                 if op.type.startswith("Ddl")]
        with tf.compat.v1.Session() as session:
            graph_values = session.run(sums)
    # Each gradient collective carries its forward collective's name.
    forward = [n for n in names if ".grad" not in n]
    assert sorted(n for n in names if ".grad" in n) == sorted(
        [f"{f}.grad" for f in forward] + [f"{f}.grad.rows" for f in forward]), names
    traced_values = [float(v) for v in tf.function(lambda: gradients(taped))()]
    # keras_ddl's own gradient: the Sum over ranks of their upstream rows
    # (every rank's upstream is the same: rank r's rows hold r).
    want = [size * rank * sizes[rank] * 4 ** (dim - 1) for dim in (1, 2, 3)]
    assert [float(v) for v in graph_values] == want, (graph_values, want)
    assert traced_values == want, (traced_values, want)

    # Constant inputs, and a loss whose terms each rank adds in its own
    # order: constant folding would run the collectives while optimising
    # the graph, in a rank-dependent order, and the ranks would wait for
    # each other (the stall seen in Horovod's gradient checks).
    def two_terms():
        out = []
        for dim in (1, 2):
            a = tf.ones([sizes[rank]] + [4] * (dim - 1)) * rank
            b = tf.ones([sizes[rank]] + [4] * (dim - 1)) * (rank + 1)
            up = tf.concat([tf.ones([s] + [4] * (dim - 1)) * r for r, s in enumerate(sizes)], 0)
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                terms = [tf.reduce_sum(tf.square(ddl.allgather(t)) * up) for t in (a, b)]
                loss = terms[0] + terms[1] if rank % 2 == 0 else terms[1] + terms[0]
            out.extend(tf.reduce_sum(g) for g in tape.gradient(loss, [a, b]))
        return out
    # d/dt of sum_r sum(up * gathered_t^2) on my rows: 2 * t * (sum over ranks of my rows of up).
    got = [float(v) for v in tf.function(two_terms)()]
    want = [2 * value * size * rank * sizes[rank] * 4 ** (dim - 1)
            for dim in (1, 2) for value in (rank, rank + 1)]
    assert got == want, (got, want)


@case
def broadcast_in_place_in_graphs_returns_the_new_values():
    """broadcast_ returns (and leaves) the root's values inside tf.function and
    in a TF1-style graph, where nothing else orders the read after the
    assignment."""
    root = size - 1
    for dtype in (np.float32, np.int32, np.uint8, np.float16):
        v = tf.Variable(np.full([3], rank, dtype))
        k = keras.Variable(np.full([2], rank + 1, np.float32))
        got = tf.function(lambda: hvd_tf.broadcast_([v, k], root))()
        assert_equal(got[0], np.full([3], root, dtype), f"tf.function {np.dtype(dtype).name}")
        assert_equal(v.numpy(), np.full([3], root, dtype), "variable after tf.function")
        assert_equal(got[1], np.full([2], root + 1, np.float32), "keras variable")
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(np.full([3], rank, np.float32))
        value, = ddl.broadcast_([v], root)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert_equal(session.run(value), np.full([3], root, np.float32), "TF1 graph value")
            assert_equal(session.run(v), np.full([3], root, np.float32), "TF1 graph variable")


@case
def object_collectives_inside_tf_function():
    @tf.function
    def exchange(x):
        config = hvd_tf.broadcast_object({"lr": 0.1 * (rank + 1), "rank": rank}, root_rank=size - 1)
        everyone = hvd_tf.allgather_object(rank * 10)
        return x * config["lr"] + float(sum(everyone))

    got = exchange(tf.constant(1.0)).numpy()
    np.testing.assert_allclose(got, 0.1 * size + 10 * sum(range(size)), rtol=1e-6)
    assert hvd.broadcast_object("eager after", root_rank=0) == "eager after"


class DoubleCompressor(hvd_tf.Compressor):
    """A custom compressor: carries floats as float64 (exact here)."""

    @staticmethod
    def compress(tensor):
        return tf.cast(tensor, tf.float64), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx)


@case
def compression_classes_are_horovods():
    x = rank_values(rank, [4])
    total = np.sum([rank_values(r, [4]) for r in range(size)], axis=0)

    def check(run):
        compressed = run(lambda: hvd.Compression.fp16.compress(tf.constant(x))[0])
        assert compressed.dtype == tf.float16, compressed.dtype
        restored = run(lambda: hvd.Compression.fp16.decompress(
            *hvd.Compression.fp16.compress(tf.constant(x))))
        assert_equal(restored, x, "fp16 round trip")
        assert hvd.Compression.fp16.compress(tf.constant(x))[1] == tf.float32, "ctx"
        ints, ctx = hvd.Compression.fp16.compress(tf.constant([1, 2]))
        assert ints.dtype == tf.int32 and ctx == tf.int32, "integers are not compressed"
        same, none_ctx = hvd.Compression.none.compress(tf.constant(x))
        assert none_ctx is None and hvd.Compression.none.decompress(same, None) is same
        for compression in (hvd.Compression.fp16, DoubleCompressor, DoubleCompressor()):
            got = run(lambda: hvd_tf.allreduce(tf.constant(x), op=hvd.Sum,
                                               compression=compression))
            assert_equal(got, total, f"allreduce with {compression}")
        got = run(lambda: hvd_tf.reducescatter(tf.constant(np.stack([x] * size)), op=hvd.Sum,
                                               compression=hvd.Compression.fp16))
        assert_equal(got, np.stack([total] * size)[block(rank, size)], "reducescatter fp16")
    both_ways(check)
    expect_all(lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                compression=DoubleCompressor),
               NotImplementedError, ["compression=", f"rank {rank}"], "custom compressor")


@case
def gradient_predivide_factor_keeps_float16_average_finite():
    """Horovod divides by gradient_predivide_factor before the sum and by
    size/factor after: float16 gradients whose plain sum overflows (every
    rank contributes about 40000, the float16 maximum is 65504) average to a
    finite value with factor size, eagerly and in tf.function."""
    w = tf.Variable(np.ones([3], np.float16))
    # Multiples of 32, so exact in float16 (its spacing above 32768).
    scale = np.float16(40000 - 1024 * rank)
    expected = np.mean([np.float32(40000 - 1024 * r) for r in range(size)])

    def check(run):
        def grads(factor):
            def fn():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(w * tf.constant(scale))
                tape = hvd_tf.DistributedGradientTape(tape, gradient_predivide_factor=factor)
                return tape.gradient(loss, [w])[0]
            return run(fn).numpy()
        assert not np.all(np.isfinite(grads(1.0))), "the float16 sum did not overflow"
        got = grads(float(size))
        assert np.all(np.isfinite(got)), got
        np.testing.assert_allclose(got.astype(np.float32), np.full([3], expected, np.float32),
                                   rtol=2e-3)
    both_ways(check)
    # The optimizer honours it too: SGD(1) from 0 lands on minus the average.
    v = keras.Variable(np.zeros([2], np.float32))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), gradient_predivide_factor=4.0)
    optimizer.apply([tf.constant(rank_values(rank, [2]))], [v])
    np.testing.assert_allclose(v.numpy(), -np.mean([rank_values(r, [2]) for r in range(size)], 0),
                               rtol=1e-6)


@case
def compressed_average_with_factors_divides_before_the_wire():
    """hvd.allreduce / grouped_allreduce with Compression.fp16, op=Average
    and pre/postscale factors on float32 values near float16's maximum: the
    engine's Average divides before the fp16 wire, so the result is finite
    and postscale * the average of prescale * x (a Sum on the wire, then
    postscale / size, gave inf). The gradient tape with
    gradient_predivide_factor and fp16 compression likewise. On one
    machine nothing crosses a wire (float32 sums in shared memory); tests/
    test_compressed_average_mpi.py runs it over the flat ring too."""
    rng = np.random.default_rng(70 + rank)
    mine = rng.uniform(60000, 65000, 1001).astype(np.float32)
    inputs = np.array(MPI.COMM_WORLD.allgather(mine), np.float64)
    # Prescaled, the values' average (about 47000) fits float16, their sum
    # over 2 or 3 ranks does not.
    expected = 2.0 * np.mean(0.75 * inputs, axis=0)

    def check(got, what):
        got = np.asarray(got)
        bad = np.count_nonzero(~np.isfinite(got))
        assert bad == 0, f"{what}: {bad} of {got.size} elements not finite, e.g. {got.ravel()[:4]}"
        np.testing.assert_allclose(got, expected[:got.size], rtol=2 ** -6, err_msg=what)
        assert digests_agree([got]), f"{what}: ranks differ"

    factors = dict(prescale_factor=0.75, postscale_factor=2.0)
    for compression in (hvd_tf.Compression.fp16, ddl.Compression.bf16):
        what = f"{compression!r}"
        check(hvd_tf.allreduce(tf.constant(mine), op=hvd_tf.Average, compression=compression,
                               **factors), f"allreduce {what}")
        grouped = hvd_tf.grouped_allreduce([tf.constant(mine), tf.constant(mine[:5])],
                                           op=hvd_tf.Average, compression=compression, **factors)
        check(grouped[0], f"grouped_allreduce {what}")
        check(grouped[1], f"grouped_allreduce {what}, second tensor")
        traced = tf.function(lambda t: hvd_tf.allreduce(t, op=hvd_tf.Average,
                                                        compression=compression, **factors))
        check(traced(tf.constant(mine)), f"allreduce {what} in tf.function")
    # Gradients of sum(w * mine) are mine: with gradient_predivide_factor and
    # fp16 compression their average is finite too.
    w = tf.Variable(np.ones([mine.size], np.float32))
    for factor in (1.0, float(size)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * tf.constant(mine))
        tape = hvd_tf.DistributedGradientTape(tape, compression=hvd_tf.Compression.fp16,
                                              gradient_predivide_factor=factor)
        got = tape.gradient(loss, [w])[0].numpy()
        assert np.all(np.isfinite(got)), f"tape, predivide {factor}: {got[:4]}"
        np.testing.assert_allclose(got, np.mean(inputs, axis=0), rtol=2 ** -6,
                                   err_msg=f"tape, predivide {factor}")


@case
def sync_batch_norm_takes_keras2_arguments():
    check_sync_batch_norm([4], traced=False, fused=False, renorm=False, virtual_batch_size=None)
    check_sync_batch_norm([4], traced=True, fused=True)
    for kwargs, word in ((dict(renorm=True), "renorm=True"),
                         (dict(virtual_batch_size=2), "virtual_batch_size=2"),
                         (dict(adjustment=lambda shape: (1.0, 0.0)), "adjustment=")):
        expect_all(lambda: hvd.SyncBatchNormalization(**kwargs), NotImplementedError,
                   [word, f"rank {rank}"], str(kwargs))


if __name__ == "__main__":
    run_cases()
