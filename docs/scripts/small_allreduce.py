"""Latency of one small allreduce: ddl.allreduce (eager) against mpi4py's
comm.Allreduce on the same bytes, in the same processes.

    SIZES=4096,65536 mpiexec -n 2 python docs/scripts/small_allreduce.py 300

Each repetition releases the ranks together with a barrier, then times one
call of ours and one of MPI's; rank 0 prints the medians. With DDL_TIMELINE
set, the engine's trace shows where our time went (docs/PERFORMANCE.md,
"Small messages").
"""

import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import keras_ddl as ddl

ddl.init()
comm = MPI.COMM_WORLD
repetitions = int(sys.argv[1]) if len(sys.argv) > 1 else 100
for nbytes in [int(v) for v in os.environ.get("SIZES", "4096,65536,1048576").split(",")]:
    x = tf.constant(np.ones(nbytes // 4, np.float32))
    x_np = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x_np)
    for _ in range(5):  # warm-up; the name enters the response cache
        ddl.allreduce(x, op=ddl.Sum, name=f"small.{nbytes}")
    ours, mpi = [], []
    for _ in range(repetitions):
        comm.Barrier()
        start = time.perf_counter()
        ddl.allreduce(x, op=ddl.Sum, name=f"small.{nbytes}")
        ours.append(time.perf_counter() - start)
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(x_np, out)
        mpi.append(time.perf_counter() - start)
    if comm.Get_rank() == 0:
        print(f"{nbytes:>8} ours {1e6 * statistics.median(ours):8.1f} us  "
              f"mpi {1e6 * statistics.median(mpi):8.1f} us", flush=True)
