"""Launched by ddlrun --min-np in tests/mpi/test_ddlrun_elastic.py on fake hosts
(a stand-in for ssh that runs every host's ranks on this machine; mpi4py
only, no TensorFlow).

    elastic_probe.py MODE LOG_DIR

Every rank appends ``attempt=A rank=R size=S host=H`` to LOG_DIR/attempts
(A: DDLRUN_RESTART_COUNT, H: the host the launcher placed it on). Rank 0
reports progress to ddlrun as BackupAndRestore does (through
keras_ddl/common/launcher_progress.py, loaded from its file so that
TensorFlow is not imported).

shrink     attempt 0: steps 1-7 done, backup of step 5; then the last rank
           kills itself (SIGKILL). Later attempts resume from step 5 and
           finish steps 6-8.
cut_off    attempt 0: the last rank stops its agent (SIGSTOP: ddlrun hears
           nothing from it any more) and hangs; every other rank then
           prints a keras_ddl diagnosis naming it unreachable and exits
           with code 70, as the engine does. Later attempts succeed.
wait       every rank says READY, then sleeps until a signal ends it
"""

import importlib.util
import os
import signal
import sys
import time

from mpi4py import MPI

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
spec = importlib.util.spec_from_file_location(
    "launcher_progress", os.path.join(REPO, "src", "keras_ddl", "common", "launcher_progress.py"))
progress = importlib.util.module_from_spec(spec)
spec.loader.exec_module(progress)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
mode, log_dir = sys.argv[1], sys.argv[2]
attempt = int(os.environ["DDLRUN_RESTART_COUNT"])
host = os.environ.get("PMI_HOSTNAME", "?")
with open(os.path.join(log_dir, "attempts"), "a") as f:
    f.write(f"attempt={attempt} rank={rank} size={size} host={host}\n")
comm.Barrier()
last = rank == size - 1


def steps(first, end):
    for step in range(first, end + 1):
        if rank == 0:
            progress.report("step", step)
            if step == 5:
                progress.report("backup", 5)
        time.sleep(0.05)


if mode == "shrink":
    if attempt == 0:
        steps(1, 7)
        comm.Barrier()
        if last:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # the launcher ends this rank
    else:
        if rank == 0:
            progress.report("resumed", 5)
        steps(6, 8)
        comm.Barrier()
        print(f"RANK {rank} of {size} done in attempt {attempt}", flush=True)
elif mode == "cut_off":
    if attempt == 0:
        if last:
            os.kill(os.getppid(), signal.SIGSTOP)  # its agent: no word reaches ddlrun
        comm.bcast(None, root=size - 1)  # the others go on once it is silent
        if last:
            time.sleep(60)
        sys.stderr.write(
            f"[keras_ddl] at unix time {time.time():.3f}: rank {rank} on {host} lost contact in "
            f"negotiation (no progress for 5 s waiting for negotiation allreduce). Unreachable: "
            f"rank(s) [{size - 1}]: rank {size - 1} on elsewhere unreachable: dead, stopped, or "
            f"the network to it is down. keras_ddl ends this process now (exit code 70) so that "
            f"the job ends instead of hanging (rank {rank})\n")
        sys.stderr.flush()
        os._exit(70)
    comm.Barrier()
    print(f"RANK {rank} of {size} done in attempt {attempt}", flush=True)
elif mode == "wait":
    print(f"RANK {rank} READY", flush=True)
    time.sleep(60)
else:
    sys.exit(f"unknown mode {mode!r}")
