"""On the test cluster with racks (2 racks x 2 nodes x 1 rank, Slurm's
variables from the ssh stand-in): the ranks learn the racks, the results
are bitwise in the nodes-then-racks order on every rank, and three 16 MB
allreduces give the uplinks their bytes (tests/cluster/test_racks_cluster.py
compares them with the uplinks' counters). Then the same ranks again with
the Slurm variables dropped and DDL_TOPOLOGY=unknown (no racks, no probe):
ddl.topology() says so and names the chain, results are bitwise in rank
order, and three 16 MB allreduces take the chain, which crosses each uplink
with the buffer once each way. Last, nothing told at all, as most jobs run:
the node leaders probe by default, every rank holds the same measured
topology, racks only when right, and rank 0 prints the probe's table
(DDL_PRINT_TOPOLOGY=1). Run under mpiexec on the cluster; prints DDLCASE
lines and each rank's traffic after the first two parts."""

import os
import socket
import sys
import time

import numpy as np
from harness import case, report, report_traffic, run_cases
from mpi4py import MPI

import keras_ddl as ddl
from keras_ddl.common import basics

COMM = MPI.COMM_WORLD
# The cases of the later inits (another_init), besides the @case ones that
# run_cases runs first.
CASES = ("untold_topology", "untold_results_in_rank_order", "untold_three_16mb_allreduces",
         "probe_measured_the_racks", "probe_results_match_the_schedule_it_chose")


@case
def racks_learnt_from_slurm():
    topo = ddl.topology()
    # The stand-in puts node1, node2 in rack1 and node3, node4 in rack2.
    assert topo["racks"] == ["core.rack1", "core.rack2"], topo
    assert topo["rack_of_rank"] == [0, 0, 1, 1] and topo["used"], topo
    assert ddl.allreduce_algorithm() == "racks", ddl.allreduce_algorithm()
    host = socket.gethostname()
    assert topo["rack_of_rank"][ddl.rank()] == (0 if host in ("node1", "node2") else 1), host


@case
def results_in_rack_order_on_every_rank():
    import tensorflow as tf
    # Every rank makes every rank's inputs (seeded by rank), so no bulk
    # traffic but keras_ddl's crosses the links. One call for the one-round
    # exchange, one for the pipelined schedule, and both fused.
    def inputs(r):
        rng = np.random.default_rng(7 + r)
        return [rng.uniform(-1, 1, n).astype(np.float32) for n in (999, 700001)]
    everyone = [inputs(r) for r in range(4)]
    xs = everyone[ddl.rank()]
    singles = [ddl.allreduce(tf.constant(x), op=ddl.Sum, name=f"rack.single.{i}").numpy()
               for i, x in enumerate(xs)]
    fused = [t.numpy() for t in ddl.grouped_allreduce([tf.constant(x) for x in xs], op=ddl.Sum,
                                                      name="rack.fused")]
    for i in range(len(xs)):
        e = [everyone[r][i] for r in range(4)]
        want = (e[0] + e[1]) + (e[2] + e[3])
        for label, got in (("single", singles[i]), ("fused", fused[i])):
            assert got.tobytes() == want.tobytes(), \
                f"{label} {i}: {int(np.sum(got != want))} elements differ from ((x0+x1)+(x2+x3))"
    import hashlib
    digests = COMM.allgather(hashlib.sha256(b"".join(s.tobytes() for s in singles)).digest())
    assert all(d == digests[0] for d in digests), "ranks hold different bits"


@case
def three_16mb_allreduces():
    import tensorflow as tf
    x = tf.ones([4 << 20], tf.float32)
    for i in range(3):
        out = ddl.allreduce(x, op=ddl.Sum, name=f"rack.big.{i}")
    assert float(out[0]) == 4.0 and float(out[-1]) == 4.0


def untold_topology():
    topo = ddl.topology()
    assert topo["source"] == "unknown" and not topo["used"], topo
    assert topo["schedule"] == "chain" and topo["probe_verdict"] == "", topo
    assert topo["description"].startswith("no topology given (DDL_TOPOLOGY=unknown): "), topo
    assert "chain" in topo["description"] and "DDL_TOPOLOGY" in topo["description"], topo
    assert ddl.allreduce_algorithm() == "flat", ddl.allreduce_algorithm()


def untold_results_in_rank_order():
    import tensorflow as tf
    # 300001 floats: 1.2 MB, the chain's size; fused with a small one that
    # the direct exchange would take alone.
    def inputs(r):
        rng = np.random.default_rng(11 + r)
        return [rng.uniform(-1, 1, n).astype(np.float32) for n in (999, 300001)]
    everyone = [inputs(r) for r in range(4)]
    xs = everyone[ddl.rank()]
    singles = [ddl.allreduce(tf.constant(x), op=ddl.Sum, name=f"untold.single.{i}").numpy()
               for i, x in enumerate(xs)]
    fused = [t.numpy() for t in ddl.grouped_allreduce([tf.constant(x) for x in xs], op=ddl.Sum,
                                                      name="untold.fused")]
    for i in range(len(xs)):
        e = [everyone[r][i] for r in range(4)]
        want = ((e[0] + e[1]) + e[2]) + e[3]
        for label, got in (("single", singles[i]), ("fused", fused[i])):
            assert got.tobytes() == want.tobytes(), \
                f"{label} {i}: {int(np.sum(got != want))} elements differ from ((x0+x1)+x2)+x3"


def untold_three_16mb_allreduces():
    import tensorflow as tf
    x = tf.ones([4 << 20], tf.float32)
    for i in range(3):
        out = ddl.allreduce(x, op=ddl.Sum, name=f"untold.big.{i}")
    assert float(out[0]) == 4.0 and float(out[-1]) == 4.0


def probe_measured_the_racks():
    import json
    topo = ddl.topology()
    assert topo["source"] == "probe" and topo["probe_seconds"] > 0, topo
    assert topo["probed_by_default"], topo
    assert topo["description"].startswith(
        "no topology given, so the node leaders probed the network at init (verdict "
        + topo["probe_verdict"]), topo
    # Every rank took rank 0's verdict: the same topology everywhere.
    views = COMM.allgather(json.dumps(topo, sort_keys=True))
    assert all(v == views[0] for v in views), views
    # Racks only when they are the right ones (node1, node2 | node3, node4);
    # a busy machine may leave the verdict unclear, never wrong.
    # Racks are acted on only once a second pass found the same partition,
    # and the description says so (or why not).
    assert (topo["probe_verdict"] == "racks") == topo["probe_confirmed"], topo
    if topo["probe_checks"]:
        assert topo["probe_checks"] in topo["description"], topo
    if topo["used"]:
        assert topo["rack_of_rank"] == [0, 0, 1, 1], topo
        assert topo["racks"] == ["probe1", "probe2"] and topo["schedule"] == "racks", topo
        assert "; confirmed: a " in topo["description"], topo
        assert ddl.allreduce_algorithm() == "racks", ddl.allreduce_algorithm()
    else:
        # Never one switch behind these 4:1 uplinks (kProbeOneSwitchShare).
        assert topo["probe_verdict"] == "unclear" and topo["schedule"] == "chain", topo


def probe_results_match_the_schedule_it_chose():
    import tensorflow as tf
    rng = np.random.default_rng(5 + ddl.rank())
    x = rng.uniform(-1, 1, 999).astype(np.float32)
    everyone = COMM.allgather(x)
    got = ddl.allreduce(tf.constant(x), op=ddl.Sum, name="probe.small").numpy()
    if ddl.topology()["used"]:
        want = (everyone[0] + everyone[1]) + (everyone[2] + everyone[3])
    else:
        want = ((everyone[0] + everyone[1]) + everyone[2]) + everyone[3]
    assert got.tobytes() == want.tobytes(), int(np.sum(got != want))


def another_init(cases, traffic):
    """init() again with the environment as changed; cases reported as
    run_cases does; rank 0 prints the part's seconds, init to shutdown (what
    it adds to the launch)."""
    began = time.time()
    basics.init()
    for fn in cases:
        start = time.time()
        try:
            fn()
            report(fn.__name__, ddl.rank(), True, seconds=time.time() - start)
        except Exception:
            import traceback
            report(fn.__name__, ddl.rank(), False, traceback.format_exc(), time.time() - start)
        COMM.Barrier()
    if traffic and os.environ.get("DDL_TEST_REPORT_TRAFFIC") == "1":
        report_traffic(ddl)
    basics.shutdown()
    if COMM.rank == 0:
        print(f"DDLPART {cases[0].__name__} {time.time() - began:.2f} s", flush=True)


if __name__ == "__main__":
    code = run_cases()
    # No racks and no probe: the chain.
    for var in ("SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN"):
        os.environ.pop(var, None)
    os.environ["DDL_TOPOLOGY"] = "unknown"
    another_init((untold_topology, untold_results_in_rank_order, untold_three_16mb_allreduces),
                 traffic=True)
    # Nothing told, as most jobs run: the default probe measures the racks
    # (a few MB across the uplinks), one small call.
    os.environ.pop("DDL_TOPOLOGY")
    os.environ["DDL_PRINT_TOPOLOGY"] = "1"
    another_init((probe_measured_the_racks, probe_results_match_the_schedule_it_chose),
                 traffic=False)
    sys.exit(code)
