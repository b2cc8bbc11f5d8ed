"""Multi-process checks of every collective against numpy (run by
tests/mpi/test_collectives_mpi.py under mpiexec with 2 and 3 ranks)."""

import hashlib
import sys
import time

import numpy as np
import tensorflow as tf
from harness import case, run_cases
from mpi4py import MPI

import keras_ddl as ddl

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64, tf.uint8, tf.int8,
          tf.int16, tf.uint16, tf.bool]
LENGTHS = [1, 7, 1000003]
rank = ddl.rank()
size = ddl.size()


def np_dtype(dtype):
    return dtype.as_numpy_dtype


def values(r, shape, dtype, low=0, high=4, seed=0):
    """Rank r's integer-valued input: sums of these are exact in every dtype."""
    rng = np.random.default_rng(1000 * seed + r)
    return rng.integers(low, high, size=shape).astype(np_dtype(dtype))


def everyone(shape, dtype, **kw):
    return [values(r, shape, dtype, **kw) for r in range(size)]


def assert_exact(got, expected, what):
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    wrong = np.count_nonzero(got.reshape(-1).view(np.uint8) != expected.reshape(-1).view(np.uint8))
    assert wrong == 0, f"{what}: {wrong} bytes differ; got {got.ravel()[:8]} expected {expected.ravel()[:8]}"


def reference(inputs, op, dtype):
    """numpy's exact answer, accumulated in float64 / int64 then cast once."""
    wide = [x.astype(np.float64 if dtype.is_floating else np.int64) for x in inputs]
    if op == ddl.Sum or op == ddl.Average:
        out = np.sum(wide, axis=0)
    elif op == ddl.Min:
        out = np.min(wide, axis=0)
    elif op == ddl.Max:
        out = np.max(wide, axis=0)
    else:
        out = np.prod(wide, axis=0)
    out = out.astype(np_dtype(dtype))
    if op == ddl.Average:
        # the core divides the (exact) sum once, in float32 for 16-bit floats
        wide_dtype = np.float32 if dtype.size == 2 else np_dtype(dtype)
        out = (out.astype(wide_dtype) / wide_dtype(size)).astype(np_dtype(dtype))
    return out


def same_on_all_ranks(array, what):
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    digests = MPI.COMM_WORLD.allgather(digest)
    assert len(set(digests)) == 1, f"{what}: results differ between ranks: {digests}"


@case
def topology_and_algorithm_follow_the_environment():
    import os
    local = int(os.environ.get("DDL_EXPECT_LOCAL_SIZE") or os.environ.get("DDL_LOCAL_SIZE", size))
    assert (ddl.local_size(), ddl.local_rank()) == (local, rank % local)
    assert (ddl.cross_size(), ddl.cross_rank()) == (size // local, rank // local)
    algo = os.environ.get("DDL_ALLREDUCE", "auto")
    if algo == "auto":
        algo = "flat" if local == 1 else ("shared_memory" if local == size else "hierarchical")
    elif algo == "hierarchical" and local == size:
        algo = "shared_memory"  # one node: the cross-node step has nothing to do
    assert ddl.allreduce_algorithm() == algo, (ddl.allreduce_algorithm(), algo)


def pool_bytes():
    """The node's output pool for allreduce results (0 when there is none)."""
    import os
    if ddl.allreduce_algorithm() == "flat" or ddl.local_size() == 1:
        return 0
    configured = int(float(os.environ.get("DDL_SHM_POOL_MB", "1024")) * 2**20)
    shm = os.statvfs("/dev/shm")
    return min(configured, shm.f_bavail * shm.f_frsize)  # the pool commits only what exists


@case
def traffic_counters_follow_the_algorithm():
    count = 1000003
    before = ddl.traffic()
    ddl.allreduce(tf.ones([count]), op=ddl.Sum, name="traffic.probe")
    after = ddl.traffic()
    delta = {k: after[k] - before[k] for k in after}
    nbytes = 4 * count
    algo = ddl.allreduce_algorithm()
    if algo == "flat":
        assert delta == {"intra_node_bytes": 0, "cross_node_bytes": 0, "flat_bytes": nbytes,
                         "shared_output_bytes": 0, "alltoall_bytes": 0, "rack_bytes": 0}, delta
        return
    if algo == "racks" and ddl.local_size() == 1:
        assert delta == {"intra_node_bytes": 0, "cross_node_bytes": 0, "flat_bytes": 0,
                         "shared_output_bytes": 0, "alltoall_bytes": 0, "rack_bytes": nbytes}, delta
        return
    assert delta["rack_bytes"] == 0, delta
    assert delta["flat_bytes"] == 0 and delta["intra_node_bytes"] == 2 * nbytes, delta
    # With room in the node's pool the result lands there once for the node;
    # without, every rank copies it out into a tensor of its own.
    pooled = pool_bytes() >= nbytes + 2 * 4096
    assert delta["shared_output_bytes"] == (nbytes if pooled else 0), (delta, pool_bytes())
    if algo == "shared_memory":
        assert delta["cross_node_bytes"] == 0, delta
    else:
        # Each rank hands only its 1/L slice of every chunk across nodes; the
        # uneven split of a chunk costs at most one element per chunk.
        share = nbytes / ddl.local_size()
        chunks = nbytes // (256 * 1024) + 1
        assert abs(delta["cross_node_bytes"] - share) <= 4 * chunks, (delta, share)


@case
def allreduce_every_dtype_op_and_length():
    for dtype in DTYPES:
        for op in (ddl.Sum, ddl.Average, ddl.Min, ddl.Max, ddl.Product):
            if op == ddl.Average and not dtype.is_floating:
                continue
            for n in LENGTHS:
                high = 3 if op == ddl.Product else 4  # products stay exact in int8/fp16
                inputs = everyone([n], dtype, high=high, low=1 if op == ddl.Product else 0)
                got = ddl.allreduce(tf.constant(inputs[rank]), op=op).numpy()
                assert_exact(got, reference(inputs, op, dtype), f"{dtype.name} {op.name} n={n}")


@case
def int16_uint16_and_bool_reductions():
    # Sum / Max on bool are logical or, Min / Product logical and (numpy's
    # sum / max / min / prod of 0s and 1s, then != 0, gives the same).
    ops = (ddl.Sum, ddl.Min, ddl.Max, ddl.Product)
    for dtype, low in ((tf.int16, -300), (tf.uint16, 0), (tf.bool, 0)):
        high = 2 if dtype == tf.bool else 300
        for op in ops:
            lo, hi = (0, 2) if dtype == tf.bool else ((1, 4) if op == ddl.Product else (low, high))
            for n in (1, 7, 100003):
                inputs = everyone([n], dtype, low=lo, high=hi, seed=90 + n)
                got = ddl.allreduce(tf.constant(inputs[rank]), op=op)
                assert got.dtype == dtype
                assert_exact(got.numpy(), reference(inputs, op, dtype),
                             f"{dtype.name} {op.name} n={n}")
            # grouped (fused with a float tensor of the same op) and reducescatter
            inputs = everyone([5, 3], dtype, low=lo, high=hi, seed=95)
            grouped = ddl.grouped_allreduce([tf.constant(inputs[rank]), tf.ones([4])], op=op)
            assert_exact(grouped[0].numpy(), reference(inputs, op, dtype), f"grouped {dtype.name}")
            counts = [5 // size + (1 if r < 5 % size else 0) for r in range(size)]
            start = sum(counts[:rank])
            got = ddl.reducescatter(tf.constant(inputs[rank]), op=op).numpy()
            assert_exact(got, reference(inputs, op, dtype)[start:start + counts[rank]],
                         f"reducescatter {dtype.name} {op.name}")
    # Wrap-around is the dtype's, as numpy's
    big = np.array([32767, -32768, 20000], np.int16)
    got = ddl.allreduce(tf.constant(big), op=ddl.Sum).numpy()
    assert_exact(got, (big.astype(np.int64) * size).astype(np.int16), "int16 wrap-around")


@case
def allreduce_scalars_empty_and_shapes():
    for dtype in (tf.float32, tf.int32, tf.bfloat16):
        for shape in ([], [0], [0, 3], [3, 0, 2], [2, 3, 5]):
            inputs = everyone(shape, dtype, seed=1)
            got = ddl.allreduce(tf.constant(inputs[rank]), op=ddl.Sum).numpy()
            assert_exact(got, reference(inputs, ddl.Sum, dtype), f"{dtype.name} shape {shape}")


@case
def allreduce_is_bitwise_identical_on_every_rank():
    # Random non-integer floats: the sum depends on the order of additions,
    # so only an algorithm that reduces each element in one place agrees.
    rng = np.random.default_rng(rank + 7)
    for dtype in (np.float32, np.float16, np.float64):
        for n in (5, 4099, 1000003):
            x = (rng.standard_normal(n) * 1000).astype(dtype)
            got = ddl.allreduce(tf.constant(x), op=ddl.Average).numpy()
            same_on_all_ranks(got, f"{np.dtype(dtype).name} n={n}")
            wide = MPI.COMM_WORLD.allgather(x.astype(np.float64))
            np.testing.assert_allclose(got.astype(np.float64), np.mean(wide, axis=0),
                                       rtol=2e-2 if dtype == np.float16 else 1e-5, atol=1.0)


@case
def sum_order_is_fixed_whatever_the_fusion():
    # Every element is summed in a fixed order: on a node ((x0 + x1) + x2)
    # + ... over its local ranks, across nodes (or over all ranks, flat) in
    # rank order of the partial sums. So a tensor's result has the same bits
    # alone or fused behind other tensors (which moves it across slice
    # owners): a restarted run that fuses differently reproduces the same
    # weights.
    rng = np.random.default_rng(rank + 11)
    x = (rng.standard_normal(100003) * 1000).astype(np.float32)
    everything = MPI.COMM_WORLD.allgather(x)

    def in_order(parts):
        total = parts[0].copy()
        for part in parts[1:]:
            total = total + part
        return total

    if ddl.allreduce_algorithm() == "flat":
        expected = in_order(everything)
    else:
        local = ddl.local_size()
        nodes = [in_order(everything[i:i + local]) for i in range(0, size, local)]
        expected = in_order(nodes)
    assert_exact(ddl.allreduce(tf.constant(x), op=ddl.Sum).numpy(), expected, "alone")
    # A small call goes in one direct exchange (flat, or across nodes when
    # the slices are small), a large one through the pairwise ring: same bits.
    assert_exact(ddl.allreduce(tf.constant(x[:1000]), op=ddl.Sum).numpy(), expected[:1000],
                 "a small call")
    for pad in (1, 333, 70001):
        got = ddl.grouped_allreduce([tf.ones([pad]), tf.constant(x)], op=ddl.Sum)[1].numpy()
        assert_exact(got, expected, f"behind {pad} elements")


@case
def grouped_allreduce_200_tensors_mixed():
    specs = []
    for i in range(200):
        dtype = [tf.float32, tf.float16, tf.int32, tf.float64][i % 4]
        shape = [[], [1], [7], [3, 5], [0], [11, 2]][i % 6]
        specs.append((dtype, shape))
    inputs = [everyone(shape, dtype, seed=10 + i) for i, (dtype, shape) in enumerate(specs)]
    outs = ddl.grouped_allreduce([tf.constant(x[rank]) for x in inputs], op=ddl.Sum)
    assert len(outs) == 200
    for i, ((dtype, shape), out) in enumerate(zip(specs, outs)):
        assert_exact(out.numpy(), reference(inputs[i], ddl.Sum, dtype), f"tensor {i}")
    averaged = ddl.grouped_allreduce([tf.constant(x[rank]) for x in inputs if x[0].dtype.kind == "f"],
                                     op=ddl.Average)
    float_inputs = [(d, x) for (d, _), x in zip(specs, inputs) if x[0].dtype.kind == "f"]
    for (dtype, x), out in zip(float_inputs, averaged):
        assert_exact(out.numpy(), reference(x, ddl.Average, dtype), f"average {dtype.name}")


@case
def grouped_allreduce_in_tf_function_many_calls():
    @tf.function
    def step(tensors):
        return ddl.grouped_allreduce(tensors, op=ddl.Sum)
    for it in range(5):  # later calls go through the response cache
        inputs = [everyone([17], tf.float32, seed=100 * it + j) for j in range(30)]
        outs = step([tf.constant(x[rank]) for x in inputs])
        for x, out in zip(inputs, outs):
            assert_exact(out.numpy(), reference(x, ddl.Sum, tf.float32), f"iteration {it}")


@case
def out_of_order_submission_in_tf_function():
    # Each rank builds its collectives in a different (rank-dependent) order,
    # and the first collective of rank 0 waits on a slow input on the other
    # ranks, so ranks really offer the names in different orders.
    n = 12
    order = list(range(n))
    np.random.default_rng(rank).shuffle(order)

    @tf.function
    def step(xs):
        outs = [None] * n
        for i in order:
            x = xs[i]
            if rank != 0 and i == 0:
                m = tf.ones([300, 300])
                for _ in range(20):
                    m = tf.matmul(m, m) / 300.0
                x = x + tf.reduce_sum(m) * 0.0
            outs[i] = ddl.allreduce(x, op=ddl.Sum, name=f"ooo.{i}")
        return outs

    inputs = [everyone([5], tf.float32, seed=200 + i) for i in range(n)]
    for _ in range(2):
        outs = step([tf.constant(x[rank]) for x in inputs])
        for i in range(n):
            assert_exact(outs[i].numpy(), reference(inputs[i], ddl.Sum, tf.float32), f"tensor {i}")


@case
def allgather_every_dtype_uneven_first_dim():
    for dtype in DTYPES:
        rows = [(r * 3 + 1) % 4 for r in range(size)]  # includes a rank with 0 rows at n=3
        inputs = [values(r, [rows[r], 3], dtype, seed=3) for r in range(size)]
        got = ddl.allgather(tf.constant(inputs[rank])).numpy()
        assert_exact(got, np.concatenate(inputs, axis=0), f"allgather {dtype.name}")
    big = [values(r, [1000003 if r == 0 else 7], tf.float32, seed=4) for r in range(size)]
    assert_exact(ddl.allgather(tf.constant(big[rank])).numpy(), np.concatenate(big), "allgather big")
    scalar = ddl.allgather(tf.constant(float(rank))).numpy()
    assert_exact(scalar, np.arange(size, dtype=np.float32), "allgather scalar")


@case
def allgather_mismatched_trailing_dims_is_an_error():
    try:
        ddl.allgather(tf.zeros([2, 3 + rank]), name="gather.bad")
    except tf.errors.FailedPreconditionError as e:  # ranks disagree: Horovod's class
        msg = str(e)
        assert "gather.bad" in msg and "shape" in msg and f"rank {rank}" in msg, msg
    else:
        raise AssertionError("mismatched allgather did not raise")


@case
def broadcast_every_dtype_and_root():
    for root in range(size):
        for dtype in DTYPES:
            for shape in ([], [7], [1000003]):
                inputs = everyone(shape, dtype, seed=5 + root)
                got = ddl.broadcast(tf.constant(inputs[rank]), root_rank=root).numpy()
                assert_exact(got, inputs[root], f"broadcast {dtype.name} root {root} {shape}")


@case
def broadcast_variables_packs_by_dtype():
    import keras
    variables = [keras.Variable(np.full([3, 2], rank, np.float32)),
                 keras.Variable(np.full([5], rank, np.int32)),
                 keras.Variable(np.float32(rank * 2))]  # float32 under numpy 1 and 2
    ddl.broadcast_variables(variables, root_rank=size - 1)
    assert_exact(variables[0].numpy(), np.full([3, 2], size - 1, np.float32), "float matrix")
    assert_exact(variables[1].numpy(), np.full([5], size - 1, np.int32), "int vector")
    assert_exact(variables[2].numpy(), np.float32(2 * (size - 1)), "scalar")


@case
def broadcast_and_allgather_carry_bool_and_other_integer_widths():
    # Every bit pattern of the 16-bit types (including those that read as a
    # float16 NaN on the wire) and the extremes of the unsigned ones.
    patterns = {
        tf.bool: lambda r: np.array([r % 2 == 0, True, False, r == 1]),
        tf.int16: lambda r: np.roll(np.arange(-32768, 32768, dtype=np.int32).astype(np.int16), r),
        tf.uint16: lambda r: np.roll(np.arange(0, 65536, dtype=np.int32).astype(np.uint16), r),
        tf.uint32: lambda r: np.array([0, 2**32 - 1, 2**31 + r], np.uint32),
        tf.uint64: lambda r: np.array([0, 2**64 - 1, 2**63 + r], np.uint64),
    }
    for dtype, make in patterns.items():
        mine = np.ascontiguousarray(make(rank))
        got = ddl.broadcast(tf.constant(mine), root_rank=size - 1)
        assert got.dtype == dtype, (dtype, got.dtype)
        assert_exact(got.numpy(), np.ascontiguousarray(make(size - 1)), f"broadcast {dtype.name}")
        got = ddl.allgather(tf.constant(mine))
        assert got.dtype == dtype, (dtype, got.dtype)
        assert_exact(got.numpy(), np.concatenate([make(r) for r in range(size)]),
                     f"allgather {dtype.name}")
    import keras
    flags = keras.Variable(np.array([rank == 0, rank != 0, True]))
    counts = keras.Variable(np.array([rank, 65535 - rank], np.uint16))
    ddl.broadcast_variables([flags, counts], root_rank=0)
    assert_exact(flags.numpy(), np.array([True, False, True]), "bool variable")
    assert_exact(counts.numpy(), np.array([0, 65535], np.uint16), "uint16 variable")


@case
def reducescatter_uneven_rows():
    for dtype in DTYPES:
        for op in (ddl.Sum, ddl.Average, ddl.Max):
            if op == ddl.Average and not dtype.is_floating:
                continue
            for rows in (1, 7, 2 * size):
                inputs = everyone([rows, 3], dtype, seed=6)
                full = reference(inputs, op, dtype)
                counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
                start = sum(counts[:rank])
                got = ddl.reducescatter(tf.constant(inputs[rank]), op=op).numpy()
                assert_exact(got, full[start:start + counts[rank]],
                             f"reducescatter {dtype.name} {op.name} rows={rows}")


@case
def barrier_waits_for_every_rank():
    import time
    if rank == size - 1:
        time.sleep(0.5)
    start = time.time()
    ddl.barrier()
    arrived = MPI.COMM_WORLD.allgather(time.time())
    if rank != size - 1:
        assert time.time() - start > 0.3, "barrier returned before the last rank arrived"
    assert max(arrived) - min(arrived) < 0.3, arrived


@case
def mismatched_shape_dtype_op_error_on_every_rank():
    attempts = {
        "shape": lambda: ddl.allreduce(tf.ones([2 + (rank % 2)]), op=ddl.Sum, name="mm.shape"),
        "dtype": lambda: ddl.allreduce(tf.ones([2], tf.float32 if rank == 0 else tf.float64),
                                       op=ddl.Sum, name="mm.dtype"),
        "reduction op": lambda: ddl.allreduce(tf.ones([2]), op=ddl.Sum if rank == 0 else ddl.Max,
                                              name="mm.op"),
        "root_rank": lambda: ddl.broadcast(tf.ones([2]), root_rank=0 if rank == 0 else 1,
                                           name="mm.root"),
        "compression": lambda: ddl.allreduce(
            tf.ones([2]), op=ddl.Sum, name="mm.compression",
            compression=ddl.Compression.fp16 if rank == 0 else ddl.Compression.none),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
        except tf.errors.FailedPreconditionError as e:  # ranks disagree: Horovod's class
            msg = str(e)
            assert what in msg, f"{what} not named in: {msg}"
            assert "'mm." in msg and f"(rank {rank})" in msg and "rank 0" in msg, msg
        else:
            raise AssertionError(f"mismatched {what} did not raise")
    # Arguments that suit no collective (Average of integers, a scalar to
    # reducescatter, a root outside the world) are refused in negotiation:
    # on every rank, whether all ranks pass them or only one does (then it
    # is a mismatch).
    refused = {
        "mm.root_range": lambda: ddl.broadcast(tf.ones([1]), root_rank=size,
                                               name="mm.root_range"),
        "mm.root_range_one_rank": lambda: ddl.broadcast(
            tf.ones([1]), root_rank=size if rank == 0 else 0, name="mm.root_range_one_rank"),
        "mm.scalar_rs": lambda: ddl.reducescatter(tf.constant(1.0), name="mm.scalar_rs"),
        "mm.int_average": lambda: ddl.allreduce(tf.ones([2], tf.int32), op=ddl.Average,
                                                name="mm.int_average"),
        "mm.int_average_rs": lambda: ddl.reducescatter(tf.ones([4, 2], tf.int64),
                                                       op=ddl.Average, name="mm.int_average_rs"),
        "mm.int_average_one_rank": lambda: ddl.allreduce(
            tf.ones([2], tf.int32 if rank == 0 else tf.float32), op=ddl.Average,
            name="mm.int_average_one_rank"),
        "mm.bool_average": lambda: ddl.allreduce(tf.ones([2], tf.bool), op=ddl.Average,
                                                 name="mm.bool_average"),
        "mm.int16_average_rs": lambda: ddl.reducescatter(tf.ones([4], tf.int16), op=ddl.Average,
                                                         name="mm.int16_average_rs"),
        "mm.int_average_grouped": lambda: ddl.grouped_allreduce(
            [tf.ones([2]), tf.ones([3], tf.int64)], op=ddl.Average,
            name="mm.int_average_grouped"),
    }
    words = {"mm.root_range": "root_rank=", "mm.root_range_one_rank": "root",
             "mm.scalar_rs": "scalar", "mm.int_average_one_rank": "dtype"}
    for name, attempt in refused.items():
        try:
            attempt()
        except (tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError) as e:
            msg = str(e)
            # What only one rank passes differs from the others' first:
            # ranks that disagree fail a precondition (Horovod's class).
            disagree = name in ("mm.root_range_one_rank", "mm.int_average_one_rank")
            assert isinstance(e, tf.errors.FailedPreconditionError) == disagree, (name, type(e))
            word = words.get(name, "op=Average is not defined")
            assert word in msg and name in msg and f"(rank {rank})" in msg, msg
        else:
            raise AssertionError(f"{name} did not raise")
    # The engine is still usable afterwards, including the same names.
    got = ddl.allreduce(tf.ones([2]), op=ddl.Sum, name="mm.shape").numpy()
    assert_exact(got, np.full([2], size, np.float32), "after mismatch")


@case
def changed_shape_under_a_cached_name_renegotiates():
    for n in (3, 3, 5, 5, 3):
        got = ddl.allreduce(tf.ones([n]), op=ddl.Sum, name="cache.reshape").numpy()
        assert_exact(got, np.full([n], size, np.float32), f"length {n}")


@case
def rejected_inputs_name_the_argument():
    checks = [
        (lambda: ddl.allreduce(tf.constant([1 + 2j])), TypeError, "complex"),
        (lambda: ddl.allreduce(tf.constant([1], tf.uint32)), TypeError, "uint32"),
        (lambda: ddl.allreduce(object()), TypeError, "tensor"),
        (lambda: ddl.grouped_allreduce([tf.ones([1]), "x"]), TypeError, "tensors[1]"),
    ]
    for fn, error, word in checks:
        try:
            fn()
        except error as e:
            assert word in str(e), f"{word!r} not in {e}"
        else:
            raise AssertionError(f"expected {error.__name__} mentioning {word}")


def _grad_checks(run):
    w = float(rank + 1)
    weights = [float(r + 1) for r in range(size)]
    x = tf.constant([1.0, 2.0, 3.0])
    # allreduce Average: d/dx of sum(w_r * mean_s x_s) summed over ranks = mean of w
    g = run(lambda t: tf.reduce_sum(ddl.allreduce(t, op=ddl.Average) * w), x)
    np.testing.assert_allclose(g, np.full(3, np.mean(weights)), rtol=1e-6)
    g = run(lambda t: tf.reduce_sum(ddl.allreduce(t, op=ddl.Sum) * w), x)
    np.testing.assert_allclose(g, np.full(3, np.sum(weights)), rtol=1e-6)
    # allgather: my rows receive the sum over ranks of their gradient rows
    rows = tf.ones([rank + 1, 2])
    g = run(lambda t: tf.reduce_sum(ddl.allgather(t) * w), rows)
    np.testing.assert_allclose(g, np.full([rank + 1, 2], np.sum(weights)), rtol=1e-6)
    # broadcast from the last rank: only the root gets the summed gradient
    g = run(lambda t: tf.reduce_sum(ddl.broadcast(t, root_rank=size - 1) * w), x)
    expected = np.sum(weights) if rank == size - 1 else 0.0
    np.testing.assert_allclose(g, np.full(3, expected), rtol=1e-6)


@case
def gradients_eager_tape():
    _grad_checks(_eager_gradient)


@case
def gradients_in_tf_function():
    _grad_checks(_traced_gradient)


def _eager_gradient(fn, x):
    """d fn(x) / dx under an eager tape, as numpy."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = fn(x)
    return tape.gradient(loss, x).numpy()


def _traced_gradient(fn, x):
    """d fn(x) / dx computed inside a tf.function, as numpy."""
    @tf.function
    def grad(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = fn(v)
        return tape.gradient(loss, v)
    return grad(x).numpy()


def _in_order(parts, add):
    out = parts[0]
    for p in parts[1:]:
        out = add(out, p)
    return out


def compressed_reference(inputs, op, wire):
    """What a float32 allreduce sent as ``wire`` gives, bit for bit: summed
    in rank order in float32 inside a node's shared memory, in the wire
    dtype (one rounding per addition) across nodes or on the flat path.
    Average divides before the wire: each value (flat) or node sum is
    multiplied by 1/size in float32 as it is converted, and the wire's sum
    is the result; with nothing on a wire, the sum is divided once."""
    algo = ddl.allreduce_algorithm()
    f32 = [tf.constant(x, tf.float32) for x in inputs]
    scale = np.float32(1) / np.float32(size) if op == ddl.Average and wire != tf.float32 \
        else None
    to_wire = lambda x: tf.cast(x if scale is None else x * scale, wire)
    if algo == "flat":
        total = _in_order([to_wire(x) for x in f32], tf.add)
        if op == ddl.Average and scale is None:
            total = to_wire(tf.cast(total, tf.float32) / size)
        return tf.cast(total, tf.float32).numpy()
    local = ddl.local_size()
    node_sums = [_in_order(f32[n:n + local], tf.add) for n in range(0, size, local)]
    if algo == "shared_memory":
        total = node_sums[0]  # nothing crosses a network: no conversion
        return (total / size if op == ddl.Average else total).numpy()
    total = tf.cast(_in_order([to_wire(s) for s in node_sums], tf.add), tf.float32)
    return (total / size if op == ddl.Average and scale is None else total).numpy()


@case
def compression_fp16_and_bf16():
    # Values that fp16 / bf16 cannot hold exactly: the results show where
    # the conversions happen (the core converts float32; float64 is cast in
    # TensorFlow before and after).
    rng = np.random.default_rng(8 + rank)
    mine = (rng.standard_normal(100003) * 3).astype(np.float32)
    inputs = MPI.COMM_WORLD.allgather(mine)
    for compression, wire in ((ddl.Compression.fp16, tf.float16),
                              (ddl.Compression.bf16, tf.bfloat16)):
        for op in (ddl.Sum, ddl.Average):
            what = f"{compression!r} {op.name}"
            before = ddl.traffic()
            got = ddl.allreduce(tf.constant(mine), op=op, compression=compression)
            after = ddl.traffic()
            assert got.dtype == tf.float32, what
            assert_exact(got.numpy(), compressed_reference(inputs, op, wire), what)
            digests = MPI.COMM_WORLD.allgather(hashlib.sha256(got.numpy().tobytes()).hexdigest())
            assert len(set(digests)) == 1, f"{what}: ranks differ"
            # Two bytes per element on the network, not four.
            sent = after["flat_bytes"] - before["flat_bytes"] + \
                after["cross_node_bytes"] - before["cross_node_bytes"]
            algo = ddl.allreduce_algorithm()
            expected = {"flat": 2 * mine.size, "shared_memory": 0,
                        "hierarchical": 2 * mine.size / ddl.local_size()}[algo]
            assert abs(sent - expected) <= 2 * (mine.size // 65536 + 1), (what, sent, expected)
        # Grouped, mixed dtypes: float32 members converted by the core,
        # float64 ones cast around it; the same bits as one by one.
        wide = tf.constant(mine.astype(np.float64))
        grouped = ddl.grouped_allreduce([tf.constant(mine), wide], op=ddl.Sum,
                                        compression=compression)
        alone = [ddl.allreduce(tf.constant(mine), op=ddl.Sum, compression=compression),
                 ddl.allreduce(wide, op=ddl.Sum, compression=compression)]
        assert grouped[1].dtype == tf.float64
        for g, a in zip(grouped, alone):
            assert_exact(g.numpy(), a.numpy(), f"{compression!r} grouped vs alone")
    got = ddl.allreduce(tf.constant(mine), op=ddl.Sum, compression=ddl.Compression.none)
    assert_exact(got.numpy(), compressed_reference(inputs, ddl.Sum, tf.float32), "none")


@case
def compressed_average_near_fp16_max_stays_finite():
    """float32 values near float16's largest (65504) averaged over an fp16
    wire: each is divided by the ranks before the wire, so the result is
    finite and close to the float32 average (summing on the wire first
    gave inf). Grouped with a second tensor, in tf.function, and while a
    rank has joined (divided by the active ranks). bf16 too."""
    rng = np.random.default_rng(60 + rank)
    mine = rng.uniform(60000, 65000, 4099).astype(np.float32)
    inputs = MPI.COMM_WORLD.allgather(mine)
    exact = np.mean(np.array(inputs, np.float64), axis=0)
    for compression, wire in ((ddl.Compression.fp16, tf.float16),
                              (ddl.Compression.bf16, tf.bfloat16)):
        what = f"{compression!r} Average near 65504"
        got = ddl.allreduce(tf.constant(mine), op=ddl.Average, compression=compression,
                            name=f"near_max.{compression!r}").numpy()
        bad = np.count_nonzero(~np.isfinite(got))
        assert bad == 0, f"{what}: {bad} of {got.size} elements not finite, e.g. {got[:4]}"
        np.testing.assert_allclose(got, exact, rtol=2 ** -6, err_msg=what)
        assert_exact(got, compressed_reference(inputs, ddl.Average, wire), what)
        same_on_all_ranks(got, what)
        grouped = ddl.grouped_allreduce([tf.constant(mine), tf.constant(mine[:7] * 0.5)],
                                        op=ddl.Average, compression=compression)
        assert_exact(grouped[0].numpy(), got, f"{what}, grouped")
        traced = tf.function(lambda t: ddl.allreduce(t, op=ddl.Average, compression=compression))
        assert_exact(traced(tf.constant(mine)).numpy(), got, f"{what}, in tf.function")
    # Rank 0 joins; the others' Average divides by size - 1 before the wire.
    joined = False
    try:
        if rank != 0:
            active = inputs[1:]
            got = ddl.allreduce(tf.constant(mine), op=ddl.Average,
                                compression=ddl.Compression.fp16, name="near_max.join").numpy()
            bad = np.count_nonzero(~np.isfinite(got))
            assert bad == 0, f"Average of the active ranks: {bad} elements not finite"
            np.testing.assert_allclose(got, np.mean(np.array(active, np.float64), axis=0),
                                       rtol=2 ** -6, err_msg="Average of the active ranks")
        joined = True
        ddl.join()
    finally:
        if not joined:
            ddl.join()


@case
def results_are_aligned_and_survive_in_place_work_elsewhere():
    # Results in the node's pool are one block viewed by every local rank's
    # tensors: each must start where TensorFlow expects (64-byte aligned),
    # and an op that could reuse its input's buffer (here y + 1 in a graph,
    # y used nowhere else) must not write into it, or the other ranks would
    # see the change.
    lengths = [1, 3, 17, 1000, 4097]
    inputs = [everyone([n], tf.float32, seed=20 + n) for n in lengths]

    @tf.function
    def reduce_then_add(xs):
        return [y + 1.0 for y in ddl.grouped_allreduce(xs, op=ddl.Sum, name="inplace.probe")]

    xs = [tf.constant(x[rank]) for x in inputs]
    if rank == 0:
        plus_one = reduce_then_add(xs)
        for x, got in zip(inputs, plus_one):
            assert_exact(got.numpy(), reference(x, ddl.Sum, tf.float32) + np.float32(1), "y + 1")
        MPI.COMM_WORLD.Barrier()
    else:
        outs = ddl.grouped_allreduce(xs, op=ddl.Sum, name="inplace.probe")
        MPI.COMM_WORLD.Barrier()  # rank 0 has computed y + 1 by now
        for x, out in zip(inputs, outs):
            assert_exact(out.numpy(), reference(x, ddl.Sum, tf.float32), "after rank 0's add")
    outs = ddl.grouped_allreduce(xs, op=ddl.Sum)
    for n, out in zip(lengths, outs):
        address = buffer_address(out)
        assert address % 64 == 0, f"result of length {n} at {address:#x}"


def buffer_address(tensor):
    """Where an eager CPU tensor's data lives, without copying it: through
    DLPack (TensorFlow before 2.19 has no ``__dlpack__`` on its tensors, only
    ``tf.experimental.dlpack.to_dlpack``)."""
    if hasattr(tensor, "__dlpack__"):
        return np.from_dlpack(tensor).ctypes.data

    class Capsule:
        def __dlpack__(self, stream=None, **kwargs):
            return tf.experimental.dlpack.to_dlpack(tensor)

        def __dlpack_device__(self):
            return (1, 0)  # kDLCPU

    return np.from_dlpack(Capsule()).ctypes.data


@case
def pool_full_falls_back_and_recovers():
    # Results held by the caller keep their pool blocks; once the pool is
    # full, allreduces fall back to copying results out (on every rank
    # alike, though only local rank 0 allocates), stay exact, and use the
    # pool again once the caller lets go.
    if pool_bytes() == 0:
        return
    count = 25600  # 100 KB of float32: a 104 KB block with its header
    inputs = everyone([count], tf.float32, seed=30)
    expected = reference(inputs, ddl.Sum, tf.float32)
    fits = pool_bytes() // (count * 4 + 4096)
    held, pooled = [], []
    for i in range(min(fits + 5, 40)):
        before = ddl.traffic()["shared_output_bytes"]
        held.append(ddl.allreduce(tf.constant(inputs[rank]), op=ddl.Sum))
        pooled.append(ddl.traffic()["shared_output_bytes"] > before)
    for out in held:
        assert_exact(out.numpy(), expected, "held result")
    same_on_all_ranks(np.array(pooled), "which results used the pool")
    if fits < 40:
        assert pooled[0] and not pooled[-1], pooled
    else:
        assert all(pooled), pooled
    del held
    before = ddl.traffic()["shared_output_bytes"]
    assert_exact(ddl.allreduce(tf.constant(inputs[rank]), op=ddl.Sum).numpy(), expected, "after")
    assert ddl.traffic()["shared_output_bytes"] == before + count * 4


@case
def results_outlive_shutdown():
    # The pool stays mapped while any result viewing it exists, even after
    # ddl.shutdown(); then keras_ddl starts again. (Runs last.)
    inputs = everyone([5000], tf.float32, seed=40)
    out = ddl.allreduce(tf.constant(inputs[rank]), op=ddl.Sum)
    ddl.shutdown()
    assert_exact(out.numpy(), reference(inputs, ddl.Sum, tf.float32), "after shutdown")
    assert_exact(tf.reduce_sum(out).numpy(),
                 np.float32(reference(inputs, ddl.Sum, tf.float32).astype(np.float64).sum()),
                 "a TensorFlow op on it after shutdown")
    ddl.init()


# Alltoall. split_matrix()[r][p]: rows rank r sends to rank p (some zero).
def split_matrix(seed=0):
    return [[(r + 2 * p + seed) % 3 for p in range(size)] for r in range(size)]


def alltoall_expected(inputs, splits):
    """(what this rank receives, received_splits) from every rank's input."""
    parts = []
    for r, x in enumerate(inputs):
        start = sum(splits[r][:rank])
        parts.append(x[start:start + splits[r][rank]])
    return np.concatenate(parts, axis=0), np.array([splits[r][rank] for r in range(size)],
                                                   np.int32)


@case
def alltoall_even_uneven_and_every_dtype():
    carried = [tf.uint32, tf.uint64]  # moved as int32 / int64
    for dtype in DTYPES + carried:
        for trailing in ([], [2, 3]):
            for seed in (0, 1):
                splits = split_matrix(seed)
                inputs = [values(r, [sum(splits[r])] + trailing, dtype, high=2 if dtype == tf.bool
                                 else 4, seed=50 + seed) for r in range(size)]
                what = f"alltoall {dtype.name} {trailing} splits {splits[rank]}"
                out, received = ddl.alltoall(tf.constant(inputs[rank]), splits=splits[rank])
                expected, expected_splits = alltoall_expected(inputs, splits)
                assert out.dtype == dtype, what
                assert_exact(out.numpy(), expected, what)
                assert_exact(received.numpy(), expected_splits, what + " received_splits")
    # No splits: an even split; int32 and int64 splits tensors alike.
    inputs = everyone([2 * size, 3], tf.float32, seed=52)
    even = [[2] * size for _ in range(size)]
    out = ddl.alltoall(tf.constant(inputs[rank]))  # without splits: no received_splits
    assert isinstance(out, tf.Tensor), type(out)
    assert_exact(out.numpy(), alltoall_expected(inputs, even)[0], "even")
    for splits_dtype in (tf.int32, tf.int64):
        out, _ = ddl.alltoall(tf.constant(inputs[rank]), tf.constant([2] * size, splits_dtype))
        assert_exact(out.numpy(), alltoall_expected(inputs, even)[0], splits_dtype.name)
    # Nothing to send at all, and blocks of several chunks (1.2 MB each).
    out, received = ddl.alltoall(tf.zeros([0, 4]), splits=[0] * size)
    assert out.shape == (0, 4) and list(received.numpy()) == [0] * size, (out.shape, received)
    rows = 300000
    inputs = everyone([rows * size], tf.float32, seed=53)
    out = ddl.alltoall(tf.constant(inputs[rank]))
    assert_exact(out.numpy(), alltoall_expected(inputs, [[rows] * size] * size)[0], "large")


@case
def alltoall_in_tf_function_and_traffic():
    @tf.function
    def exchange(x, splits):
        out, received = ddl.alltoall(x, splits=splits)
        return out * 2, received

    for it in range(3):  # later calls go through the response cache
        splits = split_matrix(it)
        inputs = [values(r, [sum(splits[r]), 5], tf.float32, seed=60 + it) for r in range(size)]
        before = ddl.traffic()["alltoall_bytes"]
        out, received = exchange(tf.constant(inputs[rank]), tf.constant(splits[rank]))
        sent = ddl.traffic()["alltoall_bytes"] - before
        expected, expected_splits = alltoall_expected(inputs, splits)
        assert_exact(out.numpy(), expected * 2, f"iteration {it}")
        assert_exact(received.numpy(), expected_splits, f"iteration {it} received_splits")
        to_others = sum(n for p, n in enumerate(splits[rank]) if p != rank) * 5 * 4
        assert sent == to_others, (sent, to_others)


def _alltoall_grad_check(run):
    # Rank p weighs what it receives by (p + 1), so the gradient of every
    # row a rank sent is the weight of the rank it went to.
    splits = split_matrix(1)
    x = tf.constant(values(rank, [sum(splits[rank]), 2], tf.float32, seed=70))
    g = run(lambda t: tf.reduce_sum(ddl.alltoall(t, splits=splits[rank])[0] * (rank + 1.0)), x)
    expected = np.concatenate([np.full([n, 2], p + 1.0, np.float32)
                               for p, n in enumerate(splits[rank])])
    assert_exact(g, expected, "alltoall gradient")


@case
def alltoall_gradient_eager_and_in_tf_function():
    _alltoall_grad_check(_eager_gradient)
    _alltoall_grad_check(_traced_gradient)


@case
def alltoall_errors_on_every_rank():
    attempts = {
        # name: (call, words the message must contain)
        "a2a.trailing": (lambda: ddl.alltoall(tf.zeros([size, 2 + rank % 2]), name="a2a.trailing"),
                         ["Mismatched alltoall", "shape", "[%d, 2]" % size, "rank 1"]),
        "a2a.length": (lambda: ddl.alltoall(tf.zeros([3, 2]), splits=[1, 1, 1] + [0] * (size - 2),
                                            name="a2a.length"), ["splits has", "entries"]),
        "a2a.sum": (lambda: ddl.alltoall(tf.zeros([size + 1, 2]), splits=[1] * size,
                                         name="a2a.sum"),
                    ["splits sum to %d" % size, "first dimension is %d" % (size + 1)]),
        # Only rank 0's splits are wrong: still every rank fails, naming it.
        "a2a.sum_one_rank": (lambda: ddl.alltoall(
            tf.zeros([size, 2]), splits=[size + 1 if rank == 0 else 1] * size,
            name="a2a.sum_one_rank"), ["splits sum to", "on rank 0"]),
        "a2a.negative": (lambda: ddl.alltoall(tf.zeros([1, 2]), splits=[2, -1] + [0] * (size - 2),
                                              name="a2a.negative"), ["splits[1]", "negative"]),
        "a2a.2d": (lambda: ddl.alltoall(tf.zeros([2, 2]), splits=tf.ones([1, size], tf.int32),
                                        name="a2a.2d"), ["splits must be a 1-D tensor"]),
        "a2a.indivisible": (lambda: ddl.alltoall(tf.zeros([size + 1, 2]), name="a2a.indivisible"),
                            ["divisible", "splits="]),
        "a2a.scalar": (lambda: ddl.alltoall(tf.constant(1.0), name="a2a.scalar"), ["scalar"]),
    }
    for name, (attempt, words) in attempts.items():
        try:
            attempt()
        except (tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError) as e:
            msg = str(e)
            # Ranks that disagree fail a precondition; a bad argument is invalid.
            mismatch = name == "a2a.trailing"
            assert isinstance(e, tf.errors.FailedPreconditionError) == mismatch, (name, type(e))
            for word in words + [f"'{name}'", f"(rank {rank})"]:
                assert word in msg, f"{word!r} not in: {msg}"
        else:
            raise AssertionError(f"{name} did not raise")
    try:
        ddl.alltoall(tf.zeros([size]), splits=[0.5] * size)
    except TypeError as e:
        assert "splits" in str(e), e
    else:
        raise AssertionError("float splits did not raise")
    # The engine is still usable afterwards, under the same names.
    out = ddl.alltoall(tf.ones([size, 2]), name="a2a.trailing")
    assert_exact(out.numpy(), np.ones([size, 2], np.float32), "after the errors")
    # Bad splits on one rank under a name the others offer from the
    # response cache: still an error everywhere, and fine again afterwards.
    for bad in (False, True, False):
        splits = [1] * size
        if bad and rank == size - 1:
            splits[0] = 2
        try:
            out, _ = ddl.alltoall(tf.ones([size, 2]), splits=splits, name="a2a.cached")
        except tf.errors.InvalidArgumentError as e:
            assert bad and f"on rank {size - 1}" in str(e), (bad, str(e))
        else:
            assert not bad, "bad splits under a cached name did not raise"
            assert_exact(out.numpy(), np.ones([size, 2], np.float32), "cached name")


def _collective_names(concrete):
    """The tensor_name inputs of the collectives in a traced function."""
    names = []
    for op in concrete.graph.get_operations():
        if op.type.startswith("Ddl"):
            const = op.inputs[1].op
            if const.type == "PlaceholderWithDefault":  # keeps the name from being folded
                const = const.inputs[0].op
            names.append(const.get_attr("value").string_val[0].decode())
    return names


@case
def unnamed_collectives_of_two_functions_never_share_a_name():
    # A model's train and test steps both reduce without names; if their
    # collectives shared names, ranks out of step could pair unrelated
    # tensors. Each traced function names its own.
    @tf.function
    def train_like(x):
        return ddl.allreduce(x) + ddl.allreduce(2 * x)

    @tf.function
    def test_like(x):
        return ddl.allreduce(x) + ddl.allreduce(2 * x)

    x = tf.ones([3])
    assert_exact(train_like(x).numpy(), np.full([3], 3.0, np.float32), "train_like")
    assert_exact(test_like(x).numpy(), np.full([3], 3.0, np.float32), "test_like")
    a = _collective_names(train_like.get_concrete_function(x))
    b = _collective_names(test_like.get_concrete_function(x))
    assert len(a) == 2 and len(b) == 2 and len(set(a)) == 2, (a, b)
    assert not set(a) & set(b), (a, b)
    assert MPI.COMM_WORLD.allgather((a, b)) == [(a, b)] * size, "names differ between ranks"


@case
def process_set_without_rank_1():
    """A set of every rank but 1 reduces, gathers, broadcasts and
    differentiates among itself while rank 1 does something else; unnamed
    calls in the set, eager or traced, do not shift the world's numbering; rank 1 is refused
    the set's ops; a list that differs between ranks is refused everywhere."""
    members = [r for r in range(size) if r != 1]
    ps = ddl.add_process_set(members)
    assert ps.included() == (rank != 1) and ps.size() == len(members)
    if ps.included():
        me = members.index(rank)
        x = values(rank, [5], tf.float32, seed=31)
        everyone = [values(r, [5], tf.float32, seed=31) for r in members]
        assert_exact(ddl.allreduce(tf.constant(x), op=ddl.Sum, process_set=ps).numpy(),
                     _in_order(everyone, np.add), "set allreduce Sum")
        got = ddl.allreduce(tf.constant(x), process_set=ps).numpy()  # unnamed, Average
        assert_exact(got, _in_order(everyone, np.add) / np.float32(len(members)), "set Average")
        assert_exact(ddl.allgather(tf.constant([rank, rank]), process_set=ps).numpy(),
                     np.repeat(np.array(members, np.int32), 2), "set allgather")
        root = members[-1]
        assert_exact(ddl.broadcast(tf.constant(x), root_rank=root, process_set=ps).numpy(),
                     values(root, [5], tf.float32, seed=31), "set broadcast, world root rank")
        try:
            ddl.broadcast(tf.constant(x), root_rank=1, process_set=ps)
        except ValueError as e:
            assert "root_rank=1" in str(e) and "not in" in str(e), e
        else:
            raise AssertionError("a root outside the set was accepted")

        @tf.function
        def grad(v):
            with tf.GradientTape() as tape:
                tape.watch(v)
                loss = tf.reduce_sum(ddl.allreduce(v, op=ddl.Sum, process_set=ps) *
                                     float(me + 1))
            return tape.gradient(loss, v)

        weights = sum(range(1, len(members) + 1))
        assert_exact(grad(tf.constant(x)).numpy(), np.full([5], weights, np.float32),
                     "set allreduce gradient in tf.function")
    else:
        time.sleep(0.2)  # something else
        try:
            ddl.allreduce(tf.ones([2]), process_set=ps)
        except tf.errors.FailedPreconditionError as e:
            assert "not a member of process set" in str(e) and f"(rank {rank})" in str(e), e
        else:
            raise AssertionError("rank 1 ran a collective of a set it is not in")
    # The world's unnamed numbering is the same on every rank afterwards,
    # eager and traced (only the members traced `grad`).
    assert_exact(ddl.allreduce(tf.ones([2]), op=ddl.Sum).numpy(), np.full([2], size, np.float32),
                 "world allreduce after the set's calls")
    world_fn = tf.function(lambda t: ddl.allreduce(t, op=ddl.Sum))
    assert_exact(world_fn(tf.ones([2])).numpy(), np.full([2], size, np.float32),
                 "traced unnamed world allreduce after a function only the set traced")
    try:
        ddl.add_process_set([0] if rank == 0 else [0, size - 1])
    except ValueError as e:
        assert "differ" in str(e) and f"rank {rank}" in str(e), e
    else:
        raise AssertionError("differing process set lists were accepted")


@case
def join_stands_in_for_ranks_out_of_data():
    """Ranks run different numbers of steps, then join: a joined rank adds
    zeros to Sum, an Average divides by the active ranks, allgather gets no
    rows from it, reducescatter and broadcast run; cached and new names,
    eager and in tf.function. A broadcast from a joined root and an
    alltoall are refused where they run. join returns the last rank on
    every rank, and afterwards every rank counts again."""
    steps = [2 + (r + 1) % size for r in range(size)]  # unique; the most: rank size - 2 or 0
    last = int(np.argmax(steps))
    fn_sum = tf.function(lambda t: ddl.allreduce(t, op=ddl.Sum, name="join.fn"))
    joined = False
    try:
        for s in range(steps[rank]):
            active = [q for q in range(size) if steps[q] > s]
            x = values(rank, [5], tf.float32, seed=40 + s)
            xs = [values(q, [5], tf.float32, seed=40 + s) for q in active]
            got = ddl.allreduce(tf.constant(x), op=ddl.Average, name="join.avg").numpy()
            np.testing.assert_allclose(got, _in_order(xs, np.add) / np.float32(len(active)),
                                       rtol=1e-6, err_msg=f"Average at step {s}")
            ints = [values(q, [3], tf.int32, seed=50 + s) for q in active]
            assert_exact(ddl.allreduce(tf.constant(values(rank, [3], tf.int32, seed=50 + s)),
                                       op=ddl.Sum, name=f"join.sum.{s}").numpy(),
                         _in_order(ints, np.add), f"new-name Sum at step {s}")
            assert_exact(fn_sum(tf.constant(x)).numpy(), _in_order(xs, np.add),
                         f"Sum in tf.function at step {s}")
            rows = np.full([rank + 1, 2], rank, np.int64)
            assert_exact(ddl.allgather(tf.constant(rows), name="join.gather").numpy(),
                         np.concatenate([np.full([q + 1, 2], q, np.int64) for q in active]),
                         f"allgather at step {s}")
            m = np.arange(2 * size * 3, dtype=np.float32).reshape(2 * size, 3) * (rank + 1)
            got = ddl.reducescatter(tf.constant(m), op=ddl.Average, name="join.rs").numpy()
            full = sum(np.arange(2 * size * 3, dtype=np.float32).reshape(2 * size, 3) * (q + 1)
                       for q in active) / np.float32(len(active))
            np.testing.assert_allclose(got, full[2 * rank:2 * rank + 2], rtol=1e-6,
                                       err_msg=f"reducescatter Average at step {s}")
            assert_exact(ddl.broadcast(tf.constant(x), root_rank=last, name=f"join.b.{s}").numpy(),
                         values(last, [5], tf.float32, seed=40 + s), f"broadcast at step {s}")
            if len(active) == 1:  # only `last` runs this step: the others have joined
                gone = next(q for q in range(size) if q != rank)
                for what, call in [
                        ("has joined", lambda: ddl.broadcast(tf.constant(x), root_rank=gone,
                                                             name=f"join.bad_b.{s}")),
                        ("have joined", lambda: ddl.alltoall(tf.zeros([size]),
                                                             name=f"join.bad_a.{s}"))]:
                    try:
                        call()
                    except tf.errors.InvalidArgumentError as e:
                        assert what in str(e) and f"rank {rank}" in str(e), e
                    else:
                        raise AssertionError(f"ran although ranks {what}")
        joined = True
        got_last = ddl.join()
        assert got_last == last, f"join returned {got_last}, the last to join was {last}"
    finally:
        if not joined:
            ddl.join()  # a failing rank still joins, so the others are not left waiting
    assert_exact(ddl.allreduce(tf.constant([float(rank)]), op=ddl.Average, name="join.avg2").numpy(),
                 np.array([sum(range(size)) / size], np.float32), "Average after the join")
    # In a tf.function the op returns a tensor; ranks that join in the same
    # cycle agree on the highest of them.
    got = tf.function(ddl.join)()
    assert isinstance(got, tf.Tensor) and 0 <= int(got) < size, got
    same_on_all_ranks(np.array([int(got)]), "join's result in tf.function")


if __name__ == "__main__":
    run_cases()
