"""Each invalid DDL_* value makes init() fail on every rank with a message
naming the variable and value; after fixing the environment init works.
Run by tests/test_config_mpi.py under mpiexec -n 3."""

import os
import sys

from harness import report
from mpi4py import MPI

from keras_ddl import basics

BAD_VALUES = [
    ("DDL_FUSION_THRESHOLD_MB", "lots"),
    ("DDL_FUSION_THRESHOLD_MB", "-1"),
    ("DDL_CYCLE_TIME_MS", "0"),
    ("DDL_CYCLE_TIME_MS", "1ms"),
    ("DDL_ALLREDUCE", "ring"),
    ("DDL_LOCAL_SIZE", "2"),        # does not divide 3 ranks
    ("DDL_LOCAL_SIZE", "1.5"),
    ("DDL_STALL_WARNING_S", "nan"),
    ("DDL_STALL_TIMEOUT_S", "-5"),
    ("DDL_CACHE_CAPACITY", "many"),
    ("DDL_PEER_TIMEOUT_S", "soon"),
    ("DDL_SPIN_POLLS", "2.5"),
    ("DDL_TIMELINE", "/nonexistent/dir/trace.json"),
]


def main():
    rank = MPI.COMM_WORLD.Get_rank()
    for var, value in BAD_VALUES:
        name = f"{var}={value}"
        # Only rank 1 has the bad value for the first variable: the others
        # must still fail rather than wait for it.
        only_one = var == "DDL_FUSION_THRESHOLD_MB" and value == "lots"
        if not only_one or rank == 1:
            os.environ[var] = value
        try:
            basics.init()
        except ValueError as e:
            msg = str(e)
            ok = var in msg and value in msg and "on rank" in msg
            report(name, rank, ok, "" if ok else f"message lacks variable/value/rank: {msg}")
        except Exception as e:  # wrong exception type
            report(name, rank, False, f"{type(e).__name__}: {e}")
        else:
            report(name, rank, False, "init() accepted the bad value")
            basics.shutdown()
        os.environ.pop(var, None)
        MPI.COMM_WORLD.Barrier()
    basics.init()
    report("valid_after_fix", rank, basics.size() == MPI.COMM_WORLD.Get_size())
    basics.shutdown()


if __name__ == "__main__":
    sys.exit(main())
