"""The first real cluster's edges, on the namespace test cluster
(tests/cluster/test_container_limits_cluster.py): 2 racks x 1 node x 4 ranks,
each node with a /dev/shm of 64 MiB of its own (as a container's), the
racks learnt from Slurm's variables. The phases run in argv's order:

small_shm       init with the defaults: the racks path's staging area
                (4 ranks x 4 slots of 4 MiB) does not fit, and every rank
                gets the one error naming /dev/shm (never a signal); then
                init again with DDL_SHM_ARENA_MB=16: a 64 MB allreduce is
                right on every rank.
slow_allgather  rank 0 prints SLOW_PHASE_READY and waits for the file
                DDL_TEST_GO_FILE (the test makes the uplinks slow first);
                then an allgather of 1 MB per rank, whose one round over
                the slow uplinks takes longer than DDL_PEER_TIMEOUT_S, must
                complete with the right rows (slow but moving is not dead).

Each rank prints "RESULT <phase> <rank> ok <seconds>" or
"RESULT <phase> <rank> FAILED <why>", and the small /dev/shm error as
"SHM_ERROR <rank> <message>".
"""

import os
import sys
import time
import traceback

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import keras_ddl as ddl

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def small_shm():
    try:
        ddl.init()
    except RuntimeError as e:
        say(f"SHM_ERROR {RANK} {e}")
    else:
        raise AssertionError("init succeeded though the staging area cannot fit in /dev/shm")
    os.environ["DDL_SHM_ARENA_MB"] = "16"
    ddl.init()
    assert ddl.allreduce_algorithm() == "racks", ddl.allreduce_algorithm()
    count = 16 * 2**20  # float32: 64 MB
    got = ddl.allreduce(tf.fill([count], float(RANK + 1)), op=ddl.Sum, name="shm.64mb").numpy()
    want = float(SIZE * (SIZE + 1) // 2)
    assert got.shape == (count,) and (got == want).all(), (got[:4], want)


def slow_allgather():
    ddl.init()
    if RANK == 0:
        say("SLOW_PHASE_READY")
        go = os.environ["DDL_TEST_GO_FILE"]
        while not os.path.exists(go):
            time.sleep(0.1)
    # Every rank starts together (the others wait here, idle in negotiation).
    ddl.allreduce(tf.zeros([1]), name="slow.start")
    rows = 2**18  # float32: 1 MB per rank
    start = time.time()
    got = ddl.allgather(tf.fill([rows], float(RANK)), name="slow.allgather").numpy()
    took = time.time() - start
    want = np.repeat(np.arange(SIZE, dtype=np.float32), rows)
    assert got.shape == want.shape and (got == want).all(), got[::rows]
    return took


for phase in sys.argv[1:]:
    start = time.time()
    try:
        took = {"small_shm": small_shm, "slow_allgather": slow_allgather}[phase]()
        say(f"RESULT {phase} {RANK} ok {took if took is not None else time.time() - start:.2f}")
    except Exception:  # reported; the next phase still runs
        say(f"RESULT {phase} {RANK} FAILED " + traceback.format_exc().replace("\n", " | "))
ddl.shutdown()
