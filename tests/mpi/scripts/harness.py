"""Runs named test cases on every rank of one mpiexec launch.

A multi-process test script defines cases with ``@case`` and calls
``run_cases()``. Each rank prints one ``DDLCASE {json}`` line per case with
its verdict; tests/launching.py launches the script and turns every case into
its own pytest result, so one launch (one TensorFlow import per rank) covers
many checks. With ``DDL_TEST_REPORT_TRAFFIC=1`` every rank also prints, after
the cases, one ``DDLTRAFFIC {json}`` line with its traffic counters, which the
cluster tests compare with the bytes the network links carried.
"""

import json
import os
import sys
import time
import traceback

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def report(name, rank, ok, detail="", seconds=0.0):
    line = json.dumps({"case": name, "rank": rank, "ok": ok, "detail": detail[-3000:],
                       "seconds": round(seconds, 3)})
    # One write per line: ranks share the launcher's stdout.
    sys.stdout.write("DDLCASE " + line + "\n")
    sys.stdout.flush()


def run_cases():
    from mpi4py import MPI

    import keras_ddl as ddl
    ddl.init()
    rank = ddl.rank()
    selected = set(sys.argv[1:])
    for fn in CASES:
        if selected and fn.__name__ not in selected:
            continue
        start = time.time()
        try:
            fn()
            report(fn.__name__, rank, True, seconds=time.time() - start)
        except Exception:  # reported, then the next case runs
            report(fn.__name__, rank, False, traceback.format_exc(), time.time() - start)
        # Keeps cases apart: a rank that failed early waits for the others here.
        MPI.COMM_WORLD.Barrier()
    if os.environ.get("DDL_TEST_REPORT_TRAFFIC") == "1":
        report_traffic(ddl)
    ddl.shutdown()


def report_traffic(ddl):
    import socket
    record = {"rank": ddl.rank(), "host": socket.gethostname(), "local_size": ddl.local_size(),
              "algorithm": ddl.allreduce_algorithm(), **ddl.traffic()}
    sys.stdout.write("DDLTRAFFIC " + json.dumps(record) + "\n")
    sys.stdout.flush()
