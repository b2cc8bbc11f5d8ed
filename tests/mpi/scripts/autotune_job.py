"""DDL_AUTOTUNE=1 on one machine, for tests/mpi/test_autotune_mpi.py: the
launcher sets DDL_AUTOTUNE, DDL_AUTOTUNE_STEPS, DDL_AUTOTUNE_CYCLES and
DDL_AUTOTUNE_FILE; the argument picks the network step tuned:

  world  DDL_LOCAL_SIZE=1, every rank a node: the flat allreduce;
  racks  4 ranks, DDL_LOCAL_SIZE=1, Slurm's variables put ranks 0-1 in
         rack ra and 2-3 in rack rb: the rack grid, with
         DDL_UPLINK_COMPRESSION=auto (RACK_ALLREDUCE_SIZED_FP16UP a
         candidate too: a call it ran must be the fp16-uplink rounding,
         any other the plain order, bit for bit).
  cross  4 ranks, DDL_LOCAL_SIZE=2: two virtual nodes of two ranks, the
         cross-node step of the hierarchical path, with the node's single
         pass (NODE_LEADER_EXCHANGE) a candidate; results are each node's
         ranks in order, then the nodes in order.

Allreduces of two sizes (two size classes) alternate, through the
measurements, the decisions (the algorithms, then the fusion threshold
and cycle time) and after them; every result is checked bitwise against
numpy's sum in the promised order (rank order; nodes then racks with
racks), on every rank. Ranks that switched at different calls, or to
different algorithms, would pair different messages and fail or hang.
Rank 0 prints the table on stderr (the test reads it); every rank reports
the fusion threshold and cycle time in force after each call
(ddl.settings_in_force(); case settings_<mode>, failed unless every
rank's are the same), which the test compares with the plan and the
table's choice."""

import json
import os
import sys

import numpy as np
from harness import report
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
SIZES = (1000, 100000)  # float32: < 64 KiB and 64 KiB - 1 MiB
# Enough for the algorithms (2 classes x 5 candidates x 2 batches with
# racks), then 7 settings x 2 windows of one cycle, and calls after both.
CALLS = 40
# What main() reports, for the mode it runs (tests/mpi/test_autotune_mpi.py
# reads both of the modes it launches).
CASES = ("results_world", "settings_world", "results_racks", "settings_racks",
         "results_cross", "settings_cross")


def through_half(x):
    return x.astype(np.float16).astype(np.float32)


def expected(everyone, mode):
    """The results a call may have: the promised order, and with racks
    also the fp16-uplink rounding (rack_allreduce.h)."""
    if mode == "racks":  # rack ra = ranks 0-1, rack rb = ranks 2-3
        ra, rb = everyone[0] + everyone[1], everyone[2] + everyone[3]
        return [ra + rb, through_half(through_half(ra) + through_half(rb))]
    if mode == "cross":  # node 0 = ranks 0-1, node 1 = ranks 2-3
        return [(everyone[0] + everyone[1]) + (everyone[2] + everyone[3])]
    total = everyone[0]
    for x in everyone[1:]:
        total = total + x
    return [total]


def main():
    mode = sys.argv[1]
    os.environ["DDL_LOCAL_SIZE"] = "2" if mode == "cross" else "1"
    if mode == "racks":
        os.environ["SLURM_TOPOLOGY_ADDR"] = f"core.{'ra' if RANK < 2 else 'rb'}.n{RANK}"
        os.environ["SLURM_TOPOLOGY_ADDR_PATTERN"] = "switch.switch.node"
        os.environ["DDL_UPLINK_COMPRESSION"] = "auto"
    # A saved table of this shape is loaded, not measured (and no call runs
    # a candidate it did not choose).
    saved = os.path.exists(os.environ.get("DDL_AUTOTUNE_FILE", "")) if RANK == 0 else None
    measuring = not COMM.bcast(saved, root=0)
    import tensorflow as tf

    import keras_ddl as ddl
    ddl.init()
    problems = []
    want_algorithm = {"racks": "racks", "cross": "hierarchical"}.get(mode, "flat")
    if ddl.allreduce_algorithm() != want_algorithm:
        problems.append(f"allreduce algorithm {ddl.allreduce_algorithm()}, not {want_algorithm}")
    rng = np.random.default_rng(100 + RANK)
    sequence = []  # the fusion threshold and cycle time in force after each call
    fp16_calls = 0  # calls whose result is the fp16-uplink rounding
    for call in range(CALLS):
        # Magnitudes differ per rank, so another summation order shows.
        x = (rng.uniform(-1, 1, SIZES[call % 2]) * 10.0 ** (RANK * 3)).astype(np.float32)
        everyone = COMM.allgather(x)
        got = ddl.allreduce(tf.constant(x), op=ddl.Sum, name=f"tuned.{call}").numpy()
        wants = expected(everyone, mode)
        if len(wants) > 1 and got.tobytes() == wants[1].tobytes():
            fp16_calls += 1
        if all(got.tobytes() != want.tobytes() for want in wants):
            problems.append(f"call {call} ({x.size} floats): {int(np.sum(got != wants[0]))} "
                            "elements differ from numpy's sum in order (nor is it the "
                            "fp16-uplink rounding)" if len(wants) > 1 else
                            f"call {call} ({x.size} floats): {int(np.sum(got != wants[0]))} "
                            "elements differ from numpy's sum in order")
        mine = COMM.allgather(got.tobytes())
        if any(m != mine[0] for m in mine):
            problems.append(f"call {call}: ranks got different bits")
        # The call's cycle set them (the executor's, before its batches),
        # and no other cycle with an allreduce can run before the next call.
        in_force = ddl.settings_in_force()
        sequence.append([in_force["fusion_threshold_mb"], in_force["cycle_time_ms"]])
    # While measuring, the fp16-uplink candidate's batches (2 per size
    # class) at least: it really sent fp16 across the racks.
    if mode == "racks" and measuring and fp16_calls < 4:
        problems.append(f"{fp16_calls} calls had the fp16-uplink result, expected 4 or more")
    report(f"results_{mode}", RANK, not problems, "; ".join(problems))
    sequences = COMM.allgather(sequence)
    same = all(s == sequences[0] for s in sequences)
    report(f"settings_{mode}", RANK, same,
           json.dumps(sequence) if same else f"ranks ran other settings: {sequences}")
    COMM.Barrier()
    ddl.shutdown()


if __name__ == "__main__":
    sys.exit(main())
