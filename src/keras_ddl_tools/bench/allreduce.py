"""Allreduce throughput of keras_ddl's TensorFlow op against mpi4py.

Two tables, in the nccl-tests convention (docs/performance-notes/README.md):
1. one float32 tensor per size, 4 KB ... 256 MB: ``ddl.allreduce`` (eager,
   through the op) interleaved with ``comm.Allreduce`` on numpy buffers of
   the same bytes, in the same processes;
2. the ResNet-50 gradient list (Keras 3 ``ResNet50`` trainable weights) as
   one ``grouped_allreduce`` vs separate mpi4py calls and one packed call.

``wrong`` counts elements that differ from the exact sum (inputs are small
integers, so every order of additions gives the exact result).
"""

import numpy as np
from mpi4py import MPI

from .common import COMM, dump_json, human_bytes, print_table, timed

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20,
                 64 << 20, 256 << 20]
COLUMNS = ["size", "count", "type", "redop", "time_us", "algbw_GBps", "busbw_GBps",
           "baseline_us", "speedup", "wrong"]


# Memory: a rank holds the input tensor (whose own buffer is also the
# baseline's send buffer), the baseline's receive buffer and one result at a
# time, about 3x the call's bytes (plus the engine's and MPI's own buffers).
# The expected result is never materialised: it repeats with period 7, so
# ``count_wrong`` compares the result in chunks against one expected chunk.
# (The earlier version held ~9x: int64 temporaries for the inputs and the
# expected array, a numpy and a TensorFlow copy of the inputs, two results at
# once, ``.numpy()`` copies; a 256 MB call on 8 ranks ran 24 GB out of memory.)

PERIOD = 7
CHECK_CHUNK = PERIOD << 17  # elements per comparison chunk (3.5 MB of float32)


def _pattern(count, scale, offset):
    """float32 ``(i % 7) * scale + offset`` for i < count, without an int64
    temporary (np.resize repeats the 7 values). Small integers: exact."""
    period = np.arange(PERIOD, dtype=np.float32) * np.float32(scale) + np.float32(offset)
    return np.resize(period, count)


def _inputs(count, rank):
    """Rank ``rank``'s input: ``i % 7 + rank`` as float32."""
    return _pattern(count, 1, rank)


def _expected(count, size):
    """The exact sum of ``_inputs`` over ``size`` ranks."""
    return _pattern(count, size, size * (size - 1) // 2)


def _input_tensor(count, rank):
    """``_inputs(count, rank)`` as a TensorFlow tensor, built by TensorFlow:
    ``tf.constant`` of a numpy array held twice the bytes after the numpy
    copy was dropped."""
    import tensorflow as tf
    with tf.device("CPU:0"):
        period = tf.constant(_inputs(PERIOD, rank))
        x = tf.tile(period, [-(-count // PERIOD)])
        return x if count % PERIOD == 0 else x[:count]


def count_wrong(result, ranks, chunk=CHECK_CHUNK):
    """Elements of ``result`` (a tensor or array, any shape) that differ from
    ``_expected(result.size, ranks)``; every element is compared, ``chunk``
    at a time (a multiple of 7: each chunk's expected values are the first
    chunk's), against a view of the result's buffer, not a copy."""
    if chunk <= 0 or chunk % PERIOD:
        raise ValueError(f"chunk must be a positive multiple of {PERIOD}, not {chunk}")
    flat = np.asarray(result).reshape(-1)  # a tensor's np.asarray aliases its buffer
    expected = _expected(min(flat.size, chunk), ranks)
    wrong = 0
    for start in range(0, flat.size, chunk):
        part = flat[start:start + chunk]
        wrong += int(np.count_nonzero(part != expected[:part.size]))
    return wrong


def _measure_size(nbytes, reps, with_fp16, n, rank):
    """One size's row. Everything it allocates is released when it returns,
    before the next size's buffers exist."""
    import keras_ddl as ddl
    count = nbytes // 4
    x_tf = _input_tensor(count, rank)
    x_np = np.asarray(x_tf)  # the tensor's buffer: the baseline sends the same bytes
    recv = np.empty_like(x_np)
    result = {}

    # Each call drops the previous call's result before making its own, so
    # one result at a time exists; the release stays inside the timed call,
    # as when the assignment released it.
    def ours():
        result.pop("out", None)
        result["out"] = ddl.allreduce(x_tf, op=ddl.Sum, name=f"bench.{nbytes}")

    def baseline():
        COMM.Allreduce(x_np, recv, op=MPI.SUM)

    def ours_fp16():
        result.pop("fp16", None)
        result["fp16"] = ddl.allreduce(x_tf, op=ddl.Sum, name=f"bench.fp16.{nbytes}",
                                       compression=ddl.Compression.fp16)

    reps_here = reps if nbytes < (64 << 20) else max(3, reps // 2)
    t_ours, t_base, t_fp16 = [], [], []
    wrong = wrong_fp16 = 0
    for i in range(reps_here):  # interleaved so both see the same machine state
        last = i == reps_here - 1
        t_ours.append(timed(ours, 1, warmup=1))
        # the last repetition's result is checked, every element; the others
        # are dropped here, before the next algorithm runs
        out = result.pop("out")
        if last:
            wrong = count_wrong(out, n)
        del out
        t_base.append(timed(baseline, 1, warmup=1))
        if with_fp16:
            t_fp16.append(timed(ours_fp16, 1, warmup=1))
            # The inputs are small integers: exact in fp16 and in its sums.
            out = result.pop("fp16")
            if last:
                wrong_fp16 = count_wrong(out, n)
            del out
    t = float(np.median(t_ours))
    tb = float(np.median(t_base))
    wrong = COMM.allreduce(wrong, op=MPI.SUM)
    algbw = nbytes / t / 1e9
    row = {"size": human_bytes(nbytes), "count": count, "type": "float32",
           "redop": "sum", "time_us": t * 1e6, "algbw_GBps": algbw,
           "busbw_GBps": algbw * 2 * (n - 1) / n, "baseline_us": tb * 1e6,
           "speedup": tb / t, "wrong": wrong,
           "time_us_runs": [v * 1e6 for v in t_ours],
           "baseline_us_runs": [v * 1e6 for v in t_base]}
    if with_fp16:
        row["fp16_us"] = float(np.median(t_fp16)) * 1e6
        row["wrong"] += COMM.allreduce(wrong_fp16, op=MPI.SUM)
    return row


def sweep(sizes, reps, with_fp16=False):
    n, rank = COMM.Get_size(), COMM.Get_rank()
    return [_measure_size(nbytes, reps, with_fp16, n, rank) for nbytes in sizes]


def resnet50_shapes(comm=None):
    """The shapes of ResNet-50's trainable weights. With ``comm``, only its
    rank 0 builds the model and sends the shapes to the others: at 16 ranks
    on one machine, a model per rank ran it out of memory."""
    import keras
    shapes = None
    if comm is None or comm.Get_rank() == 0:
        model = keras.applications.ResNet50(weights=None)
        shapes = [tuple(int(d) for d in w.shape) for w in model.trainable_weights]
        del model
        keras.backend.clear_session()
    return shapes if comm is None else comm.bcast(shapes, root=0)


def gradient_list(reps, limit=None):
    import tensorflow as tf

    import keras_ddl as ddl
    n, rank = COMM.Get_size(), COMM.Get_rank()
    shapes = resnet50_shapes(COMM)[:limit]
    arrays = [_inputs(int(np.prod(s)), rank).reshape(s) for s in shapes]
    tensors = [tf.constant(a) for a in arrays]
    recvs = [np.empty_like(a) for a in arrays]
    packed = np.concatenate([a.ravel() for a in arrays])
    packed_recv = np.empty_like(packed)
    total = packed.nbytes
    result = {}

    # As in a training step, the graph holds the gradients: the functions
    # capture the tensors. Passing 214 tensors as arguments instead costs
    # TensorFlow ~4 ms per call before any op runs (the "as arguments" row).
    @tf.function
    def grouped_fn():
        return ddl.grouped_allreduce(tensors, op=ddl.Sum, name="bench.resnet50")

    @tf.function
    def grouped_args_fn(ts):
        return ddl.grouped_allreduce(ts, op=ddl.Sum, name="bench.resnet50.args")

    @tf.function
    def per_tensor_fn():
        return [ddl.allreduce(t, op=ddl.Sum, name=f"bench.resnet50.{i}")
                for i, t in enumerate(tensors)]

    def grouped():
        result["out"] = grouped_fn()

    def grouped_args():
        result["args_out"] = grouped_args_fn(tensors)

    def per_tensor():
        per_tensor_fn()

    def separate():
        for a, r in zip(arrays, recvs):
            COMM.Allreduce(a, r, op=MPI.SUM)

    def one_packed():
        COMM.Allreduce(packed, packed_recv, op=MPI.SUM)

    times = {k: [] for k in ("grouped", "grouped_args", "per_tensor", "separate", "packed")}
    for _ in range(reps):
        times["grouped"].append(timed(grouped, 1, warmup=1))
        times["grouped_args"].append(timed(grouped_args, 1, warmup=1))
        times["per_tensor"].append(timed(per_tensor, 1, warmup=1))
        times["separate"].append(timed(separate, 1, warmup=1))
        times["packed"].append(timed(one_packed, 1, warmup=1))
    med = {k: float(np.median(v)) for k, v in times.items()}
    def list_wrong(outs):
        return COMM.allreduce(sum(count_wrong(o, n) for o in outs), op=MPI.SUM)
    wrong = list_wrong(result["out"])
    base = med["separate"]
    runs = {k: [t * 1e6 for t in v] for k, v in times.items()}
    label = f"{len(shapes)} tensors, {total / (1 << 20):.1f} MB"
    rows = [
        {"method": "ddl.grouped_allreduce (tf.function)", "tensors": label,
         "time_us": med["grouped"] * 1e6, "vs_separate": base / med["grouped"], "wrong": wrong,
         "time_us_runs": runs["grouped"]},
        {"method": "... the same, tensors passed as arguments", "tensors": label,
         "time_us": med["grouped_args"] * 1e6, "vs_separate": base / med["grouped_args"],
         "wrong": list_wrong(result["args_out"]), "time_us_runs": runs["grouped_args"]},
        {"method": "ddl.allreduce per tensor (tf.function)", "tensors": label,
         "time_us": med["per_tensor"] * 1e6, "vs_separate": base / med["per_tensor"], "wrong": "-",
         "time_us_runs": runs["per_tensor"]},
        {"method": "mpi4py Allreduce per tensor", "tensors": label,
         "time_us": base * 1e6, "vs_separate": 1.0, "wrong": "-",
         "time_us_runs": runs["separate"]},
        {"method": "mpi4py Allreduce, one packed buffer", "tensors": label,
         "time_us": med["packed"] * 1e6, "vs_separate": base / med["packed"], "wrong": "-",
         "time_us_runs": runs["packed"]},
    ]
    return rows


def main(args):
    import keras_ddl as ddl
    ddl.init()
    n = COMM.Get_size()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    with_fp16 = getattr(args, "with_fp16", False)
    rows = sweep(sizes, args.reps, with_fp16)
    print_table(f"allreduce: keras_ddl op vs mpi4py comm.Allreduce, {n} ranks, "
                f"median of {args.reps} interleaved repetitions", COLUMNS +
                (["fp16_us"] if with_fp16 else []), rows)
    # What ran across nodes (ddl.topology(): the schedule of large calls
    # and why), so a table says which schedule `auto` took.
    topology = ddl.topology()
    payload = {"ranks": n, "allreduce": rows,
               "network": {k: topology[k] for k in ("schedule", "source", "description",
                                                    "probe_seconds", "probe_verdict",
                                                    "probe_confirmed", "probe_checks")}}
    if not args.skip_resnet:
        grad_rows = gradient_list(max(3, args.reps // 2) if args.reps > 1 else 1,
                                  args.gradient_tensors)
        print_table("ResNet-50 gradient list (Keras 3 ResNet50 trainable weights), float32 sum",
                    ["method", "tensors", "time_us", "vs_separate", "wrong"], grad_rows)
        payload["resnet50_gradients"] = grad_rows
    dump_json(args.json, payload)
    if getattr(args, "plot", None) and COMM.Get_rank() == 0:
        plot_busbw(args.plot, rows, n)


def plot_busbw(path, rows, n):
    """PNG of busbw against message size, ours and the baseline."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed: no plot written (pip install matplotlib)")
        return
    sizes = [r["count"] * 4 for r in rows]
    factor = 2 * (n - 1) / n
    ours = [r["busbw_GBps"] for r in rows]
    base = [b / (r["baseline_us"] * 1e-6) / 1e9 * factor for b, r in zip(sizes, rows)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(sizes, ours, marker="o", label="keras_ddl allreduce (TF op)")
    ax.plot(sizes, base, marker="s", label="mpi4py comm.Allreduce")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [human_bytes(b) for b in sizes], rotation=45)
    ax.set_xlabel("message size (float32)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"allreduce busbw, {n} ranks")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"# plot written to {path}")
