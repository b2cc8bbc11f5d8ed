"""Transfers for tests/cluster/test_cluster_mpi.py on the namespace cluster
(argv[1] picks one):

broadcast_64mb     rank 0 broadcasts 64 MB (run over a 100 Mbit/s link
                   with a peer timeout of 3 s: must complete)
allreduce_forever  64 MB allreduces until the job is ended (the test cuts a
                   link meanwhile: the cut mostly lands in a data transfer);
                   the even ranks (one on each node) time out 3 s after
                   their node-mates, so each node's ranks report at
                   different moments
idle_forever       one allreduce, then nothing but the engine's idle
                   negotiation until the job is ended (a cut lands there)
job_identity N     allreduces through node shared memory, checking that
                   the sums are this job's (two jobs run at once)
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

import keras_ddl as ddl

mode = sys.argv[1]
if mode == "allreduce_forever" and int(os.environ.get("PMI_RANK", "0")) % 2 == 0:
    # The launcher ends a host's ranks when one of them exits: a rank that
    # reports first must not end before its node-mate has reported too
    # (DDL_PEER_TIMEOUT_S is a per-rank setting).
    os.environ["DDL_PEER_TIMEOUT_S"] = str(float(os.environ["DDL_PEER_TIMEOUT_S"]) + 3)
ddl.init()
rank, size = ddl.rank(), ddl.size()


def say(text):
    sys.stdout.write(f"RESULT {text}\n")
    sys.stdout.flush()


if mode == "broadcast_64mb":
    assert float(os.environ["DDL_PEER_TIMEOUT_S"]) < 5, "the transfer must outlast the timeout"
    count = 16 * 2**20  # float32: 64 MB
    x = tf.fill([count], 7.0) if rank == 0 else tf.zeros([count])
    y = ddl.broadcast(x, root_rank=0, name="big.broadcast").numpy()
    assert y.shape == (count,) and (y == 7.0).all(), y[:4]
    say("broadcast_64mb ok")
elif mode == "allreduce_forever":
    x = tf.ones([16 * 2**20])
    for step in range(10**9):
        ddl.allreduce(x, op=ddl.Sum, name=f"stream.{step % 2}")
        if step == 0:
            sys.stdout.write(f"STEPPING rank {rank}\n")
            sys.stdout.flush()
elif mode == "idle_forever":
    ddl.allreduce(tf.ones([4]), name="once")
    sys.stdout.write(f"STEPPING rank {rank}\n")
    sys.stdout.flush()
    while True:
        time.sleep(1)
elif mode == "job_identity":
    job = int(sys.argv[2])
    for step in range(40):
        got = ddl.allreduce(tf.fill([300007], float(job)), op=ddl.Sum,
                            name=f"job.{step % 3}").numpy()
        assert (got == job * size).all(), (job, got[:4])
    say(f"job_identity {job} ok")
ddl.shutdown()
