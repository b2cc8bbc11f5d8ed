"""Launched by ddlrun on the test cluster (test_ddlrun_cluster.py).

report: every rank says where it runs and what it sees, then all ranks
        write long lines at once, flushing in the middle of each line.
kill:   after a barrier, rank 3 kills itself with SIGKILL; the others wait
        until the launcher stops them.
"""

import os
import socket
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
mode = sys.argv[1]
comm.Barrier()
if mode == "report":
    total = comm.allreduce(rank)  # MPI works across the hosts
    sys.stdout.write(f"RANK {rank} host={socket.gethostname()} "
                     f"var={os.environ.get('DDLRUN_TEST_VAR')} sum={total}\n")
    sys.stdout.flush()
    mark = "abcdefgh"[rank]
    for _ in range(int(sys.argv[2])):
        sys.stdout.write(mark * 2500)
        sys.stdout.flush()
        sys.stdout.write(mark * 2500 + "\n")
        sys.stdout.flush()
    sys.stderr.write(f"rank {rank} done\n")
elif mode == "kill":
    if rank == 3:
        sys.stdout.write(f"RANK 3 killed at {time.time():.3f}\n")
        sys.stdout.flush()
        os.kill(os.getpid(), 9)
    time.sleep(120)
else:
    sys.exit(f"unknown mode {mode!r}")
