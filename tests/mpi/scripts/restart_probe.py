"""Launched by ddlrun --max-restarts in tests/mpi/test_ddlrun_restart.py (mpi4py only, no TensorFlow).

    restart_probe.py MODE LOG_DIR

Every rank appends ``attempt=A rank=R`` to LOG_DIR/attempts (A: DDLRUN_RESTART_COUNT).

fail_first   in the first attempt the last rank writes a keras_ddl-like diagnosis line to
             stderr and exits with code 3; later attempts succeed
always_fail  the last rank kills itself (SIGKILL) in every attempt
wait         every rank says READY, then sleeps until a signal ends it
"""

import os
import signal
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
mode, log_dir = sys.argv[1], sys.argv[2]
attempt = int(os.environ["DDLRUN_RESTART_COUNT"])
with open(os.path.join(log_dir, "attempts"), "a") as f:
    f.write(f"attempt={attempt} rank={rank}\n")
comm.Barrier()
last = rank == size - 1
if mode == "fail_first":
    if attempt == 0 and last:
        sys.stderr.write(f"[keras_ddl] probe diagnosis of attempt {attempt}\n")
        sys.stderr.flush()
        os._exit(3)
    if attempt > 0:
        comm.Barrier()
        print(f"RANK {rank} done in attempt {attempt}", flush=True)
    else:
        time.sleep(60)  # the launcher ends this rank
elif mode == "always_fail":
    if last:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
elif mode == "wait":
    print(f"RANK {rank} READY", flush=True)
    time.sleep(60)
else:
    sys.exit(f"unknown mode {mode!r}")
