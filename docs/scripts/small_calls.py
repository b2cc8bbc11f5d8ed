"""Small calls against MPICH in the same processes: one 4 KB allreduce
called eagerly, and a chain of 20 dependent 4 KB allreduces inside one
tf.function (each call's input is the previous call's output), per call.

    mpiexec -n 2 python docs/scripts/small_calls.py [REPS]

SIZES (bytes, default 4096) picks the sizes of the eager rows; the chain is
always 4 KB. ONLY=eager or ONLY=chain runs one kind alone (for counting a
call's system calls with `perf stat -e syscalls:...` over two launches of
different REPS). Each repetition releases the ranks together with a barrier,
then times ours and MPICH's (mpi4py from numpy, the same bytes, and for the
chain 20 Allreduce calls in a row, each on the previous result). Rank 0
prints the medians in microseconds a call.
"""

import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import keras_ddl as ddl

CHAIN = 20

ddl.init()
comm = MPI.COMM_WORLD
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def timed(fn):
    comm.Barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def report(label, ours, mpi, calls=1):
    if comm.Get_rank() == 0:
        o = 1e6 * statistics.median(ours) / calls
        m = 1e6 * statistics.median(mpi) / calls
        print(f"{label:<14} ours {o:9.1f} us  mpi {m:9.1f} us  ours/mpi {o / m:6.2f}", flush=True)


ONLY = os.environ.get("ONLY", "")
for nbytes in [int(v) for v in os.environ.get("SIZES", "4096").split(",") if ONLY != "chain"]:
    x = tf.constant(np.ones(nbytes // 4, np.float32))
    x_np = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x_np)
    n = reps if nbytes <= (1 << 20) else max(5, reps // 40)
    for _ in range(5):  # warm-up; the name enters the response cache
        ddl.allreduce(x, op=ddl.Sum, name=f"small.{nbytes}")
    ours, mpi = [], []
    for _ in range(n):
        ours.append(timed(lambda: ddl.allreduce(x, op=ddl.Sum, name=f"small.{nbytes}")))
        mpi.append(timed(lambda: comm.Allreduce(x_np, out)))
    report(f"eager {nbytes}", ours, mpi)


@tf.function
def chain(v):
    for i in range(CHAIN):
        v = ddl.allreduce(v, op=ddl.Average, name=f"chain.{i}")
    return v


def mpi_chain(a, b):
    for _ in range(CHAIN):
        comm.Allreduce(a, b)
        a, b = b, a


if ONLY == "eager":
    sys.exit(0)
x = tf.constant(np.ones(1024, np.float32))
a, b = np.ones(1024, np.float32), np.empty(1024, np.float32)
for _ in range(3):
    chain(x).numpy()
ours, mpi = [], []
for _ in range(reps // 10 if ONLY else max(10, reps // 10)):
    ours.append(timed(lambda: chain(x).numpy()))
    mpi.append(timed(lambda: mpi_chain(a, b)))
report("chain 4096", ours, mpi, CHAIN)
