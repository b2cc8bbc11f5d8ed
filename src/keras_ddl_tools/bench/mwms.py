"""The peer: TensorFlow's MultiWorkerMirroredStrategy all_reduce vs ours.

    mpiexec -n 2 python -m keras_ddl.bench mwms

With Keras 3, MultiWorkerMirroredStrategy's ``model.fit`` fails, but its
``strategy.run`` + ``ReplicaContext.all_reduce`` works and is the comparison
for raw collective speed (keras-team/keras#20585). Every rank builds its
``TF_CONFIG`` (one worker per rank on localhost, ports chosen by rank 0)
and creates the strategy (ring collectives over gRPC) before any other
TensorFlow op, then, per message size and for the ResNet-50 gradient list,
times the strategy's all_reduce and ``ddl.allreduce`` /
``ddl.grouped_allreduce`` on the same tensors, interleaved, each inside a
``tf.function``.
"""

import json
import os
import socket

import numpy as np

from .common import COMM, dump_json, human_bytes, print_table, timed

DEFAULT_SIZES = [4 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20]
COLUMNS = ["size", "count", "type", "redop", "ddl_us", "mwms_us", "ddl_busbw_GBps",
           "mwms_busbw_GBps", "speedup", "wrong"]


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _strategy():
    """MultiWorkerMirroredStrategy over this MPI job's ranks (RING)."""
    ports = COMM.bcast(_free_ports(COMM.Get_size()) if COMM.Get_rank() == 0 else None, root=0)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{p}" for p in ports]},
        "task": {"type": "worker", "index": COMM.Get_rank()}})
    import tensorflow as tf
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _busbw(nbytes, seconds, n):
    return nbytes / seconds / 1e9 * 2 * (n - 1) / n


def main(args):
    strategy = _strategy()  # before any other TensorFlow op
    import tensorflow as tf

    import keras_ddl as ddl

    from .allreduce import _expected, _inputs, resnet50_shapes
    n, rank = COMM.Get_size(), COMM.Get_rank()
    sum_ = tf.distribute.ReduceOp.SUM

    device = strategy.extended.worker_devices[0]

    def mwms_reducer():
        @tf.function
        def reduce(values):
            def replica_fn(vs):
                # Inside a tf.function the arguments carry no device, and
                # the strategy then finds no destination to reduce to.
                with tf.device(device):
                    vs = [tf.identity(v) for v in vs]
                    return tf.distribute.get_replica_context().all_reduce(sum_, vs)
            return strategy.run(replica_fn, args=(values,))
        return reduce

    @tf.function
    def ours(values):
        return ddl.grouped_allreduce(values, op=ddl.Sum, name="bench.mwms_peer")

    def compare(values):
        """(ddl seconds, mwms seconds, wrong elements in ours, wrong in MWMS,
        every repetition's (ddl, mwms) seconds)."""
        reduce = mwms_reducer()
        out = {}

        def run_ours():
            out["ddl"] = ours(values)

        def run_mwms():
            out["mwms"] = reduce(values)

        t_ddl, t_mwms = [], []
        for _ in range(args.reps):  # interleaved: both see the same machine state
            t_ddl.append(timed(run_ours, 1, warmup=1))
            t_mwms.append(timed(run_mwms, 1, warmup=1))
        wrong = [0, 0]
        for i, name in enumerate(("ddl", "mwms")):
            for got, v in zip(out[name], values):
                expected = _expected(int(np.prod(v.shape)), n).reshape(v.shape)
                wrong[i] += int(np.count_nonzero(np.asarray(got) != expected))
        return (float(np.median(t_ddl)), float(np.median(t_mwms)),
                COMM.allreduce(wrong[0]), COMM.allreduce(wrong[1]), (t_ddl, t_mwms))

    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    rows = []
    for nbytes in sizes:
        count = nbytes // 4
        t_ddl, t_mwms, wrong, wrong_mwms, runs = compare([tf.constant(_inputs(count, rank))])
        rows.append({"size": human_bytes(nbytes), "count": count, "type": "float32",
                     "redop": "sum", "ddl_us": t_ddl * 1e6, "mwms_us": t_mwms * 1e6,
                     "ddl_busbw_GBps": _busbw(count * 4, t_ddl, n),
                     "mwms_busbw_GBps": _busbw(count * 4, t_mwms, n),
                     "speedup": t_mwms / t_ddl, "wrong": wrong + wrong_mwms,
                     "ddl_us_runs": [t * 1e6 for t in runs[0]],
                     "mwms_us_runs": [t * 1e6 for t in runs[1]]})
    print_table(f"all_reduce: keras_ddl (tf.function) vs MultiWorkerMirroredStrategy RING "
                f"strategy.run, {n} ranks, median of {args.reps} interleaved repetitions",
                COLUMNS, rows)
    payload = {"ranks": n, "mwms": rows}
    shapes = resnet50_shapes()[:args.gradient_tensors]
    grads = [tf.constant(_inputs(int(np.prod(s)), rank).reshape(s)) for s in shapes]
    t_ddl, t_mwms, wrong, wrong_mwms, runs = compare(grads)
    total = sum(int(np.prod(s)) for s in shapes) * 4
    grad_rows = [{"tensors": f"{len(shapes)} tensors, {human_bytes(total)}",
                  "ddl_us": t_ddl * 1e6, "mwms_us": t_mwms * 1e6, "speedup": t_mwms / t_ddl,
                  "wrong": wrong + wrong_mwms, "ddl_us_runs": [t * 1e6 for t in runs[0]],
                  "mwms_us_runs": [t * 1e6 for t in runs[1]]}]
    print_table("ResNet-50 gradient list, one all_reduce of the whole list (grouped)",
                ["tensors", "ddl_us", "mwms_us", "speedup", "wrong"], grad_rows)
    payload["resnet50_gradients"] = grad_rows
    dump_json(args.json, payload)
