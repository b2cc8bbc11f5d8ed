"""Settings that decide what goes on the wire must be equal on every rank:
when only the last rank's value differs, init() fails on every rank with a
message naming the setting and each rank's value; settings that are per
rank by nature may differ. Run by tests/mpi/test_config_mpi.py under mpiexec
with 2 and with 3 ranks."""

import os
import sys

from harness import report
from mpi4py import MPI

from keras_ddl.common import basics

# Every case main() reports (tests/mpi/test_config_mpi.py checks each, with
# 2 and 3 ranks): differs:VARIABLE for each row of SHARED, then the rows of
# PER_RANK together.
CASES = ("differs:DDL_FUSION_THRESHOLD_MB", "differs:DDL_CACHE_CAPACITY",
         "differs:DDL_ALLREDUCE", "differs:DDL_LOCAL_SIZE", "differs:DDL_SHM_POOL_MB",
         "differs:DDL_AUTOTUNE", "differs:DDL_AUTOTUNE_STEPS", "differs:DDL_AUTOTUNE_CYCLES",
         "differs:DDL_UPLINK_COMPRESSION", "per_rank_settings_may_differ")
# (variable, value on the other ranks, value on the last rank, as printed).
SHARED = [
    ("DDL_FUSION_THRESHOLD_MB", "1", "64"),
    ("DDL_CACHE_CAPACITY", "1024", "16"),
    ("DDL_ALLREDUCE", "flat", "auto"),
    ("DDL_LOCAL_SIZE", "1", None),  # the last rank: the world size (both divide it)
    ("DDL_SHM_POOL_MB", "0", "16"),
    ("DDL_AUTOTUNE", "0", "1"),
    ("DDL_AUTOTUNE_STEPS", "5", "7"),
    ("DDL_AUTOTUNE_CYCLES", "5", "2"),
    ("DDL_UPLINK_COMPRESSION", "none", "fp16"),
]
PER_RANK = [("DDL_SPIN_POLLS", "50", "7"), ("DDL_ENGINE_PRIORITY", "normal", "high"),
            ("DDL_AUTOTUNE_FILE", "/nonexistent/a", "/nonexistent/b"),
            ("DDL_CYCLE_TIME_MS", "1", "2"),
            ("DDL_JOB_SECRET", "0" * 32, "f" * 32)]  # rank 0's is the group's


def expected_values(size, others, last):
    if size == 2:
        return f"rank 0: {others}, rank 1: {last}"
    return f"ranks 0-{size - 2}: {others}, rank {size - 1}: {last}"


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    for var, others, last in SHARED:
        last = last or str(size)
        os.environ[var] = last if rank == size - 1 else others
        name = f"differs:{var}"
        try:
            basics.init()
        except ValueError as e:
            msg = str(e)
            want = f"{var} differs between ranks: {expected_values(size, others, last)}"
            ok = want in msg and f"(rank {rank})" in msg
            report(name, rank, ok, "" if ok else f"expected '{want}' and the rank in: {msg}")
        except Exception as e:  # wrong exception type
            report(name, rank, False, f"{type(e).__name__}: {e}")
        else:
            report(name, rank, False, "init() accepted a setting that differs between ranks")
            basics.shutdown()
        os.environ.pop(var)
        comm.Barrier()
    for var, others, last in PER_RANK:
        os.environ[var] = last if rank == size - 1 else others
    try:
        basics.init()
        ok, detail = basics.size() == size, ""
        comm.Barrier()  # one rank's shutdown stops every engine
        basics.shutdown()
    except Exception as e:
        ok, detail = False, f"{type(e).__name__}: {e}"
    report("per_rank_settings_may_differ", rank, ok, detail)


if __name__ == "__main__":
    sys.exit(main())
