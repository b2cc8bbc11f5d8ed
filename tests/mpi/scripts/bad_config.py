"""Each invalid DDL_* value makes init() fail on every rank with a message
naming the variable and value; after fixing the environment init works.
Run by tests/mpi/test_config_mpi.py under mpiexec -n 3."""

import os
import sys
import time

from harness import report
from mpi4py import MPI

from keras_ddl.common import basics

# Every case main() reports (tests/mpi/test_config_mpi.py checks each):
# VARIABLE=VALUE is init() refusing that value, then the two cases after.
CASES = (
    "DDL_FUSION_THRESHOLD_MB=lots",
    "DDL_FUSION_THRESHOLD_MB=-1",
    "DDL_CYCLE_TIME_MS=0",
    "DDL_CYCLE_TIME_MS=1ms",
    "DDL_ALLREDUCE=ring",
    "DDL_LOCAL_SIZE=2",        # does not divide 3 ranks
    "DDL_LOCAL_SIZE=1.5",
    "DDL_STALL_WARNING_S=nan",
    "DDL_STALL_TIMEOUT_S=-5",
    "DDL_CACHE_CAPACITY=many",
    "DDL_PEER_TIMEOUT_S=soon",
    "DDL_SPIN_POLLS=2.5",
    "DDL_TIMELINE=/nonexistent/dir/trace.json",
    "DDL_ENGINE_PRIORITY=max",
    "DDL_UPLINK_COMPRESSION=gzip",
    "DDL_PRINT_TOPOLOGY=yes",
    "DDL_JOB_SECRET=0123456789abcdef0123456789abcdeZ",
    "valid_after_fix",
    "engine_thread_priority",
)
BAD_VALUES = [tuple(name.split("=", 1)) for name in CASES if "=" in name]


def engine_thread_prio():
    """prio (120 + nice) of this process's "ddl-engine" thread, from /proc;
    None if there is no such thread."""
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() != "ddl-engine":
                continue
        with open(f"/proc/self/task/{tid}/sched") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "prio":
                    return int(value)
    return None


def check_engine_priority(rank):
    """DDL_ENGINE_PRIORITY reaches the engine thread: high makes it nice -10
    when the process may (root here), normal leaves it alone, auto (the
    default) is high when the job spans several nodes (here: DDL_LOCAL_SIZE=1
    makes each rank a node) and normal on one. (The unprivileged fallback,
    a short slice: tests/core/thread_priority_check.cc.)"""
    raised = 110 if os.geteuid() == 0 else 120
    settings = [({}, 120), ({"DDL_LOCAL_SIZE": "1"}, raised),
                ({"DDL_ENGINE_PRIORITY": "high"}, raised),
                ({"DDL_ENGINE_PRIORITY": "normal", "DDL_LOCAL_SIZE": "1"}, 120)]
    problems = []
    for env, want in settings:
        os.environ.update(env)
        basics.init()
        deadline = time.time() + 5  # the engine thread names itself as it starts
        while (prio := engine_thread_prio()) is None and time.time() < deadline:
            time.sleep(0.01)
        MPI.COMM_WORLD.Barrier()  # one rank's shutdown stops every engine
        basics.shutdown()
        for var in env:
            os.environ.pop(var)
        if prio != want:
            problems.append(f"{env or 'defaults'}: engine thread prio {prio}, expected {want}")
    report("engine_thread_priority", rank, not problems, "; ".join(problems))


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
            if var == "DDL_JOB_SECRET":  # a secret is named, not shown
                ok = (var in msg and "character 32 is not a hexadecimal digit" in msg
                      and value not in msg and "on rank" in msg)
            else:
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
    check_engine_priority(rank)


if __name__ == "__main__":
    sys.exit(main())
