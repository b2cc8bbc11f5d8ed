"""DDL_AUTOTUNE=1 on one machine, for tests/test_autotune_mpi.py: the
launcher sets DDL_AUTOTUNE, DDL_AUTOTUNE_STEPS, DDL_AUTOTUNE_CYCLES and
DDL_AUTOTUNE_FILE; the argument picks the network step tuned:

  world  DDL_LOCAL_SIZE=1, every rank a node: the flat allreduce;
  racks  4 ranks, DDL_LOCAL_SIZE=1, Slurm's variables put ranks 0-1 in
         rack ra and 2-3 in rack rb: the rack grid.

Allreduces of two sizes (two size classes) alternate, through the
measurements, the decisions (the algorithms, then the fusion threshold
and cycle time) and after them; every result is checked bitwise against
numpy's sum in the promised order (rank order; nodes then racks with
racks), on every rank. Ranks that switched at different calls, or to
different algorithms, would pair different messages and fail or hang.
Rank 0 prints the table on stderr (the test reads it); every rank reports
the fusion threshold and cycle time in force after each call (case
settings_<mode>, failed unless every rank's are the same), which the test
compares with the plan and the table's choice."""

import ctypes
import json
import os
import sys

import numpy as np
from harness import report
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
SIZES = (1000, 100000)  # float32: < 64 KiB and 64 KiB - 1 MiB
# Enough for the algorithms (2 classes x 4 candidates x 2 batches with
# racks), then 7 settings x 2 windows of one cycle, and calls after both.
CALLS = 40


def expected(everyone, mode):
    if mode == "racks":  # rack ra = ranks 0-1, rack rb = ranks 2-3
        return (everyone[0] + everyone[1]) + (everyone[2] + everyone[3])
    total = everyone[0]
    for x in everyone[1:]:
        total = total + x
    return total


def main():
    mode = sys.argv[1]
    os.environ["DDL_LOCAL_SIZE"] = "1"
    if mode == "racks":
        os.environ["SLURM_TOPOLOGY_ADDR"] = f"core.{'ra' if RANK < 2 else 'rb'}.n{RANK}"
        os.environ["SLURM_TOPOLOGY_ADDR_PATTERN"] = "switch.switch.node"
    import tensorflow as tf

    import keras_ddl as ddl
    ddl.init()
    problems = []
    want_algorithm = "racks" if mode == "racks" else "flat"
    if ddl.allreduce_algorithm() != want_algorithm:
        problems.append(f"allreduce algorithm {ddl.allreduce_algorithm()}, not {want_algorithm}")
    rng = np.random.default_rng(100 + RANK)
    from keras_ddl import basics
    in_force = (ctypes.c_double * 2)()
    sequence = []  # the fusion threshold and cycle time in force after each call
    for call in range(CALLS):
        # Magnitudes differ per rank, so another summation order shows.
        x = (rng.uniform(-1, 1, SIZES[call % 2]) * 10.0 ** (RANK * 3)).astype(np.float32)
        everyone = COMM.allgather(x)
        got = ddl.allreduce(tf.constant(x), op=ddl.Sum, name=f"tuned.{call}").numpy()
        want = expected(everyone, mode)
        if got.tobytes() != want.tobytes():
            problems.append(f"call {call} ({x.size} floats): {int(np.sum(got != want))} elements "
                            "differ from numpy's sum in order")
        mine = COMM.allgather(got.tobytes())
        if any(m != mine[0] for m in mine):
            problems.append(f"call {call}: ranks got different bits")
        # The call's cycle set them (the executor's, before its batches),
        # and no other cycle with an allreduce can run before the next call.
        if basics._core.ddl_settings_in_force(in_force) != 0:
            problems.append("ddl_settings_in_force failed")
        sequence.append([in_force[0], in_force[1]])
    report(f"results_{mode}", RANK, not problems, "; ".join(problems))
    sequences = COMM.allgather(sequence)
    same = all(s == sequences[0] for s in sequences)
    report(f"settings_{mode}", RANK, same,
           json.dumps(sequence) if same else f"ranks ran other settings: {sequences}")
    COMM.Barrier()
    ddl.shutdown()


if __name__ == "__main__":
    sys.exit(main())
