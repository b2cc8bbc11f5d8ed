"""Racks on one machine, 4 ranks: each rank sets the variables a cluster
would give its node before init (DDL_LOCAL_SIZE=1 makes every rank a
node), so racks need no network. Run by tests/mpi/test_racks_mpi.py under
mpiexec -n 4.

Racks are interleaved ({0, 3} and {1, 2}), so the promised order
((x0 + x3) + (x1 + x2)) differs from rank order, and the results are
checked bitwise against numpy in that order, on every rank, for a call the
one-round exchange takes, one the pipelined schedule takes, and both fused
in one call; the same with DDL_UPLINK_COMPRESSION=fp16 against its promised
rounding (one and two local ranks). Errors: ranks without a topology, ranks of one node in two
racks, a malformed DDL_TOPOLOGY, DDL_ALLREDUCE=racks with uneven racks:
init fails on every rank naming the ranks and what each saw."""

import os
import socket
import sys

import numpy as np
from harness import report
from mpi4py import MPI

import keras_ddl as ddl
from keras_ddl.common import basics

# Every case main() reports, in order (tests/mpi/test_racks_mpi.py checks each).
CASES = ("ranks_without_topology", "one_node_in_two_racks", "malformed_ddl_topology_on_one_rank",
         "racks_refused_for_uneven_racks", "topology_from_slurm", "rack_order_one_rank_per_node",
         "uplink_fp16_one_rank_per_node", "racks_with_two_local_ranks",
         "uplink_fp16_two_local_ranks")
COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
RACK_OF = {0: "ra", 3: "ra", 1: "rb", 2: "rb"}
# Rank-major grid: rack ra's nodes (ranks 0, 3), then rack rb's (1, 2).
ORDER = [[0, 3], [1, 2]]
VARIABLES = ("SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN", "DDL_TOPOLOGY",
             "DDL_ALLREDUCE", "DDL_LOCAL_SIZE", "DDL_UPLINK_COMPRESSION")


def set_env(env):
    for var in VARIABLES:
        os.environ.pop(var, None)
    os.environ.update(env)


def slurm(rank=RANK):
    return {"SLURM_TOPOLOGY_ADDR": f"core.{RACK_OF[rank]}.n{rank}",
            "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node", "DDL_LOCAL_SIZE": "1"}


def expect_init_error(name, env, must_contain):
    set_env(env)
    try:
        basics.init()
    except ValueError as e:
        msg = str(e)
        missing = [part for part in must_contain if part not in msg]
        report(name, RANK, not missing, f"message lacks {missing}: {msg}" if missing else "")
    except Exception as e:  # wrong exception type
        report(name, RANK, False, f"{type(e).__name__}: {e}")
    else:
        report(name, RANK, False, "init() succeeded")
        basics.shutdown()
    COMM.Barrier()


def rack_order(inputs, op):
    """((x0 + x3) + (x1 + x2)), then one division for Average, in float32."""
    racks = []
    for members in ORDER:
        value = inputs[members[0]].copy()
        for r in members[1:]:
            value = value + inputs[r]
        racks.append(value)
    total = racks[0] + racks[1]
    if op == "average":
        total = total / np.float32(len(inputs))
    return total


def through_half(x):
    return x.astype(np.float16).astype(np.float32)


def rack_order_fp16_uplinks(inputs, op):
    """DDL_UPLINK_COMPRESSION=fp16 (rack_allreduce.h): each rack's float32
    partial rounded to float16, the racks summed in float32, one division
    for Average, the result rounded to float16."""
    racks = []
    for members in ORDER:
        value = inputs[members[0]].copy()
        for r in members[1:]:
            value = value + inputs[r]
        racks.append(through_half(value))
    total = racks[0] + racks[1]
    if op == "average":
        total = total / np.float32(len(inputs))
    return through_half(total)


def check_results(name, reference=rack_order):
    import tensorflow as tf
    problems = []
    rng = np.random.default_rng(100 + RANK)
    # 1001 floats: the one-round exchange (3 x 4 KB sent per rank); 300001:
    # the pipelined schedule (two pieces); 7: tiny.
    lengths = [1001, 300001, 7]
    mine = [rng.uniform(-1, 1, n).astype(np.float32) for n in lengths]
    everyone = COMM.allgather(mine)
    for op_name, op in (("sum", ddl.Sum), ("average", ddl.Average)):
        singles = [ddl.allreduce(tf.constant(x), op=op, name=f"{name}.{op_name}.{i}").numpy()
                   for i, x in enumerate(mine)]
        fused = [t.numpy() for t in ddl.grouped_allreduce(
            [tf.constant(x) for x in mine], op=op, name=f"{name}.{op_name}.fused")]
        for i, n in enumerate(lengths):
            want = reference([everyone[r][i] for r in range(4)], op_name)
            for label, got in (("single", singles[i]), ("fused", fused[i])):
                if got.tobytes() != want.tobytes():
                    bad = int(np.sum(got != want))
                    problems.append(f"{op_name} {label} length {n}: {bad} elements differ from "
                                    "((x0 + x3) + (x1 + x2))")
        # The same bits on every rank.
        digests = COMM.allgather(b"".join(s.tobytes() for s in singles))
        if any(d != digests[0] for d in digests):
            problems.append(f"{op_name}: ranks hold different bits")
    return problems


def main():
    # Ranks 2 and 3 were given no topology: every rank names them.
    env = slurm() if RANK < 2 else {"DDL_LOCAL_SIZE": "1"}
    expect_init_error("ranks_without_topology", env, [
        "ranks disagree about the topology", "rank 0 (host", "rack 'core.ra' from "
        "SLURM_TOPOLOGY_ADDR=core.ra.n0", "ranks 2-3 (host", "saw no topology", f"(rank {RANK})"])
    # Two ranks of one node (DDL_LOCAL_SIZE=2: ranks 0 and 1) in two racks.
    env = dict(slurm(), DDL_LOCAL_SIZE="2")
    expect_init_error("one_node_in_two_racks", env, [
        "ranks of one node disagree about its rack", "rank 0 (host", "rack 'core.ra'",
        "rank 1 (host", "rack 'core.rb'"])
    # A malformed DDL_TOPOLOGY on rank 1 only: every rank hears of it.
    host = socket.gethostname()
    env = {"DDL_TOPOLOGY": f"a={host}" if RANK != 1 else f"a={host};b", "DDL_LOCAL_SIZE": "1"}
    expect_init_error("malformed_ddl_topology_on_one_rank", env, [
        "the topology could not be read: rank 1", "'b' names no rack"])
    # DDL_ALLREDUCE=racks over racks of 1 and 3 nodes.
    uneven = {0: "ra", 1: "rb", 2: "rb", 3: "rb"}
    env = {"SLURM_TOPOLOGY_ADDR": f"core.{uneven[RANK]}.n{RANK}", "DDL_LOCAL_SIZE": "1",
           "DDL_ALLREDUCE": "racks"}
    expect_init_error("racks_refused_for_uneven_racks", env, [
        "DDL_ALLREDUCE=racks needs as many nodes in every rack", "2 racks of uneven sizes"])

    # The good case: 2 racks x 2 nodes x 1 rank.
    set_env(slurm())
    basics.init()
    topo = ddl.topology()
    ok = (topo["racks"] == ["core.ra", "core.rb"] and topo["rack_of_rank"] == [0, 1, 1, 0]
          and topo["nodes_per_rack"] == 2 and topo["source"] == "SLURM_TOPOLOGY_ADDR"
          and topo["used"] and ddl.allreduce_algorithm() == "racks"
          and topo["description"] == "2 racks x 2 nodes (SLURM_TOPOLOGY_ADDR): core.ra = "
                                     "ranks 0, 3; core.rb = ranks 1-2")
    report("topology_from_slurm", RANK, ok, f"{topo} {ddl.allreduce_algorithm()}")
    before = ddl.traffic()["rack_bytes"]
    problems = check_results("one_rank_per_node")
    moved = ddl.traffic()["rack_bytes"] - before
    if moved == 0:
        problems.append("no bytes went through the rack allreduce")
    report("rack_order_one_rank_per_node", RANK, not problems, "; ".join(problems))
    COMM.Barrier()
    basics.shutdown()

    # The same grid with fp16 on the uplinks: the promised rounding, bit for
    # bit on every rank, for the one-round exchange, the pipeline and fused.
    set_env(dict(slurm(), DDL_UPLINK_COMPRESSION="fp16"))
    basics.init()
    problems = check_results("uplink_fp16", rack_order_fp16_uplinks)
    report("uplink_fp16_one_rank_per_node", RANK, not problems, "; ".join(problems))
    COMM.Barrier()
    basics.shutdown()

    # 2 racks x 1 node x 2 local ranks: shared memory inside the node, the
    # rack allreduce across (DDL_TOPOLOGY by host cannot split one machine,
    # so Slurm's per-node variables stand in again).
    node_rack = "ra" if RANK < 2 else "rb"
    set_env({"SLURM_TOPOLOGY_ADDR": f"core.{node_rack}.n{RANK // 2}", "DDL_LOCAL_SIZE": "2",
             "DDL_ALLREDUCE": "racks"})
    basics.init()
    problems = []
    if ddl.allreduce_algorithm() != "racks" or ddl.local_size() != 2:
        problems.append(f"algorithm {ddl.allreduce_algorithm()}, local size {ddl.local_size()}")
    import tensorflow as tf
    rng = np.random.default_rng(200 + RANK)
    x = rng.uniform(-1, 1, 600001).astype(np.float32)
    everyone = COMM.allgather(x)
    got = ddl.allreduce(tf.constant(x), op=ddl.Sum, name="local2").numpy()
    want = (everyone[0] + everyone[1]) + (everyone[2] + everyone[3])
    if got.tobytes() != want.tobytes():
        problems.append(f"{int(np.sum(got != want))} elements differ from the node-then-rack sum")
    report("racks_with_two_local_ranks", RANK, not problems, "; ".join(problems))
    COMM.Barrier()
    basics.shutdown()

    # And with fp16 on the uplinks: a rack's partial is its node's float32
    # sum; the node path divides an Average after the cross-node sum.
    set_env({"SLURM_TOPOLOGY_ADDR": f"core.{node_rack}.n{RANK // 2}", "DDL_LOCAL_SIZE": "2",
             "DDL_ALLREDUCE": "racks", "DDL_UPLINK_COMPRESSION": "fp16"})
    basics.init()
    problems = []
    total = through_half(through_half(everyone[0] + everyone[1]) +
                         through_half(everyone[2] + everyone[3]))
    for op_name, op, want in (("sum", ddl.Sum, total),
                              ("average", ddl.Average, total / np.float32(4))):
        got = ddl.allreduce(tf.constant(x), op=op, name=f"local2.fp16.{op_name}").numpy()
        if got.tobytes() != want.tobytes():
            problems.append(f"{op_name}: {int(np.sum(got != want))} elements differ from the "
                            "fp16-uplink result")
    report("uplink_fp16_two_local_ranks", RANK, not problems, "; ".join(problems))
    COMM.Barrier()
    basics.shutdown()
    set_env({})


if __name__ == "__main__":
    sys.exit(main())
