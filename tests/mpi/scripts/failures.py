"""Failure modes for tests/mpi/test_failures_mpi.py (argv[1] picks one):

hang   rank 1 stops itself (SIGSTOP) mid-training: the others must name it
vanish rank 1's program is replaced by `sleep` mid-training (exec): the
       MPI launcher sees its process live on, the others must find the
       rank gone (its probe port closed with it)
kill   rank 1 is killed (SIGKILL) mid-training: the job must end non-zero
exit   rank 1 calls os._exit(3) mid-training: likewise
raise  rank 1 raises SystemExit mid-training: likewise
stall  rank 1 skips one named collective: a stall warning, then an error
       on every rank naming the tensor and the missing rank; each rank
       reports the share of a core it used while it waited (STALL_CPU)
"""

import os
import signal
import sys
import time

import tensorflow as tf

import keras_ddl as ddl

mode = sys.argv[1]
rank = ddl.rank()


def say(text):
    sys.stdout.write(f"RANK {rank} {text}\n")
    sys.stdout.flush()


try:
    start = time.time()
    for step in range(1000000):
        ddl.allreduce(tf.ones([256]), name=f"step.{step % 4}")
        if step == 20:
            if mode == "stall":
                stall_wall, stall_cpu = time.time(), time.process_time()
                if rank != 1:
                    ddl.allreduce(tf.ones([8]), name="skipped.by.rank1")
                ddl.allreduce(tf.ones([8]), name="after.skip")
                say("stall not detected")
                sys.exit(3)
            if rank == 1 and mode == "hang":
                say("stopping")
                os.kill(os.getpid(), signal.SIGSTOP)
            if rank == 1 and mode == "vanish":
                say("vanishing")
                os.execv("/bin/sleep", ["sleep", "120"])
            if rank == 1 and mode in ("kill", "exit", "raise"):
                say(f"dies ({mode}) at {time.time():.3f}")
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "exit":
                    os._exit(3)
                raise SystemExit("rank 1 gives up")  # escapes the handler below
except Exception as e:
    if mode == "stall":
        say(f"STALL_CPU {(time.process_time() - stall_cpu) / (time.time() - stall_wall):.3f}")
    say(f"ERROR {type(e).__name__} after {time.time() - start:.1f}s: {e}")
    sys.exit(1)
