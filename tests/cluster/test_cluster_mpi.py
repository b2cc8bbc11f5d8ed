"""The collectives across a real (simulated) network: ranks in network
namespaces joined by rate-capped links (keras_ddl.cluster), MPI over TCP.

Every launch also checks that what keras_ddl says crossed nodes really went
over the links: the bytes the bridge counted on each node's link are at
least what the ranks' traffic counters imply. Skipped (with the reason) only
where namespaces cannot be made: not root, or no ip / tc.
"""

import json
import re
import subprocess
import time

import pytest
from launching import TESTS_DIR, LiveLaunch, case_names
from fault_reports import PHASES, fault_reports
from probe_flood import IdleFlood, probe_ports

SCRIPT = "collectives.py"
EVERY_CASE = [c for c in case_names(SCRIPT)
              if c not in ("pool_full_falls_back_and_recovers", "results_outlive_shutdown")]
ALLREDUCE_CASES = [
    "topology_and_algorithm_follow_the_environment", "allreduce_every_dtype_op_and_length",
    "allreduce_scalars_empty_and_shapes", "allreduce_is_bitwise_identical_on_every_rank",
    "sum_order_is_fixed_whatever_the_fusion", "grouped_allreduce_200_tensors_mixed",
    "out_of_order_submission_in_tf_function", "mismatched_shape_dtype_op_error_on_every_rank",
    "compression_fp16_and_bf16"]
# Training across nodes, with gradients overlapping the backward pass (the
# default): equal to one process on the global batch, bitwise the same in
# every gradient layout, and a one-rank overflow skipped on every rank.
KERAS_CASES = [
    "fit_sgd_momentum_matches_single_process", "fit_lars_matches_single_process",
    "gradient_layouts_are_bitwise_identical_and_overlap",
    "mixed_float16_overflow_on_one_rank_is_skipped_everywhere",
    "gradient_tape_averages_in_eager_and_graph"]
STRATEGY_CASES = [
    "fit_evaluate_predict_match_one_process_on_the_global_batch",
    "gradient_layouts_give_bitwise_identical_training",
    "mixed_float16_overflow_on_one_rank_is_skipped_everywhere"]

# name: (nodes, ranks per node, environment, script, cases). Every
# collective with the automatic choice at 2 nodes x 2 ranks (hierarchical);
# the allreduce contract at 3 x 1 (one rank a node: the flat world) and
# again with the flat path forced at 2 x 2; training through
# DistributedOptimizer and DDLStrategy.
LAUNCHES = {
    "2x2-auto": (2, 2, {}, SCRIPT, EVERY_CASE),
    "3x1-auto": (3, 1, {}, SCRIPT, ALLREDUCE_CASES),
    "2x2-flat": (2, 2, {"DDL_ALLREDUCE": "flat"}, SCRIPT, ALLREDUCE_CASES[:4]),
    "2x2-keras": (2, 2, {}, "keras_cases.py", KERAS_CASES),
    "2x1-strategy": (2, 1, {}, "strategy_cases.py", STRATEGY_CASES),
}


def launch(launcher, name):
    nodes, per_node, env, script, cases = LAUNCHES[name]
    # DDL_LOCAL_SIZE is not set: the nodes are found by MPI_COMM_TYPE_SHARED.
    env = dict(env, DDL_EXPECT_LOCAL_SIZE=str(per_node))
    return launcher.cluster_cases(nodes, per_node, script, env=env, cases=cases)


@pytest.mark.parametrize("launch_name, case",
                         [(n, c) for n, (_, _, _, _, cases) in LAUNCHES.items() for c in cases])
def test_across_nodes(launcher, launch_name, case):
    launch(launcher, launch_name).check(case)


def traffic_records(run):
    return [json.loads(m.group(1)) for m in re.finditer(r"^DDLTRAFFIC (.*)$", run.proc.stdout,
                                                        re.MULTILINE)]


@pytest.mark.parametrize("launch_name", list(LAUNCHES))
def test_cross_node_bytes_went_over_the_links(launcher, launch_name):
    run = launch(launcher, launch_name)
    run.check_clean_exit()
    nodes, per_node, _, _, _ = LAUNCHES[launch_name]
    records = traffic_records(run)
    assert len(records) == nodes * per_node, run.proc.stdout[-2000:]
    hosts = {r["host"] for r in records}
    assert hosts == {f"node{i + 1}" for i in range(nodes)}, hosts
    sent = [s for s, _ in run.link_bytes]
    received = [r for _, r in run.link_bytes]
    for i in range(nodes):
        mine = [r for r in records if r["host"] == f"node{i + 1}"]
        assert len(mine) == per_node and all(r["local_size"] == per_node for r in mine), mine
        algorithm = mine[0]["algorithm"]
        if algorithm == "hierarchical":
            # Each local rank allreduces its slice with the other nodes:
            # it sends (K-1)/K of it in the reduce-scatter and as much again
            # in the all-gather.
            payload = sum(r["cross_node_bytes"] for r in mine) * 2 * (nodes - 1) / nodes
        else:
            # Flat, one rank per node: all it sends leaves the node, and
            # every schedule sends at least the buffer once (the chain's
            # ends: their partial up or the result down; the pairwise one
            # 2(n-1)/n of it). Two per node: at least the reduce-scatter's
            # share for the other node's ranks.
            share = 1.0 if per_node == 1 else 0.5
            payload = sum(r["flat_bytes"] for r in mine) * share
        # The collectives' cases move megabytes; the training cases' models
        # are small (kilobytes a step), but their gradients crossed too.
        assert payload > (1e6 if LAUNCHES[launch_name][3] == SCRIPT else 1e3), (launch_name, mine)
        assert sent[i] >= payload and received[i] >= payload * 0.9, (
            f"node{i + 1}: the link carried {sent[i]} bytes out and {received[i]} in, but the "
            f"ranks' counters imply at least {payload:.0f}: the traffic did not cross the link")


# --- a slow link is not a dead rank ---------------------------------------

SLOW_SCRIPT = "cluster_transfers.py"


def test_a_broadcast_longer_than_the_peer_timeout_completes(launcher):
    # About 5.4 s of transfer over the link with DDL_PEER_TIMEOUT_S=3: the
    # ranks see that the bytes move, and a slow transfer is not a dead peer.
    cluster = launcher.cluster(2, "100mbit")
    try:
        start = time.time()
        proc, moved = launcher.on_cluster(cluster, 1, SLOW_SCRIPT, "broadcast_64mb",
                                          env={"DDL_PEER_TIMEOUT_S": "3"}, timeout=240)
        elapsed = time.time() - start
    finally:
        cluster.set_rate("1gbit")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "RESULT broadcast_64mb ok" in proc.stdout, proc.stdout[-3000:]
    # Node 1 (rank 0, the root) sent the 64 MB over its link.
    assert moved[0][0] >= 64 * 2**20, moved
    assert elapsed > 5, f"64 MB at 100 Mbit/s took only {elapsed:.1f} s: was the link shaped?"


# --- a cut link is an error, never a hang --------------------------------

# Moving 64 MB allreduces, a cut mostly lands in a data transfer; idle, in
# the engine's negotiation. Either way the report is the same. With the
# allreduces, ranks 0 and 2 time out 3 s after their node-mates (1 and 3):
# a rank that reported waits for the ranks that still answer to report too
# before it ends (mpiexec's proxy ends a host's ranks when one exits), so
# every rank's report is there.
#
# Idle, the ranks also have strangers at their probe ports: 1000 connections
# from this machine's namespace (over the bridge) that never send the job's
# secret, kept open throughout (reopened as the responders drop them). They
# read nothing, and every report is the same, as soon after the cut as
# without them.
@pytest.mark.parametrize("activity", ["allreduce_forever", "idle_forever"])
def test_cut_link_fails_every_rank_naming_the_unreachable_ones(launcher, activity):
    cluster = launcher.cluster(2, "1gbit")
    timeout_s = 5
    nprocs = 4
    argv = launcher.cluster_argv(cluster, 2, SLOW_SCRIPT, activity)  # nprocs: 2 a node
    env = launcher.cluster_env({"DDL_PEER_TIMEOUT_S": str(timeout_s)})
    run = LiveLaunch(argv, env)
    cut_at = flood = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and run.count("STEPPING") < nprocs:
            time.sleep(0.2)
        assert run.count("STEPPING") == nprocs, run.report()
        if activity == "idle_forever":
            targets = [(address, port) for ns, address in zip(cluster.namespaces,
                                                              cluster.addresses)
                       for port in probe_ports(ns, address)]
            assert len(targets) == nprocs, targets  # one responder per rank
            flood = IdleFlood(targets, total=1000)
            time.sleep(2)
            assert flood.most == 1000, flood.most
        time.sleep(1)  # well inside the stream of 64 MB allreduces
        cluster.set_link(1, False)
        cut_at = time.time()
        # Node 1's ranks report through a working link; node 2's lines reach
        # the launcher only once the link is back, so each report carries
        # the time it was made.
        while time.time() < cut_at + timeout_s + 20:
            if {0, 1} <= set(fault_reports(run.stderr())):
                break
            time.sleep(0.2)
        time.sleep(5)
    finally:
        if flood is not None:
            opened, read, most = flood.stop()
        cluster.set_link(1, True)  # the launcher's own connections need it back to end
        code = run.wait(timeout=90)
    text = run.stderr()
    reports = fault_reports(text)
    assert set(reports) == set(range(nprocs)), text[-4000:]
    if flood is not None:
        assert read == 0 and opened >= 1000, (opened, read, most)
    # Idle, every report comes the peer timeout and a probe's patience (1 s)
    # after the cut (5.96-5.99 s in 4 runs with the flood and 2 without): a
    # flood that delayed the probes would show here. Moving data, the
    # timeout counts from the last bytes moved and a node-mate may wait 3 s
    # more for the other's report (above).
    late = {r: round(report.when - cut_at, 2) for r, report in reports.items()}
    bound = timeout_s + 1.5 if activity == "idle_forever" else timeout_s + 1.5 + 3 + 2
    assert max(late.values()) < bound, late
    # Node 1 holds ranks 0 and 1, node 2 ranks 2 and 3. Whichever phase the
    # cut hit, every rank gives the same report: it names both ranks of the
    # other side, on their host, as unreachable (their host does not answer
    # its probes), and no rank of its own side, except one that had already
    # reported and ended its process: that one is gone.
    for r, report in reports.items():
        assert report.phase in PHASES, report.text
        mine, other = (1, 2) if r < 2 else (2, 1)
        other_side = {2, 3} if r < 2 else {0, 1}
        assert report.host == f"node{mine}", report.text
        assert {p: s for p, s in report.states.items() if p in other_side} == \
            dict.fromkeys(other_side, "unreachable"), report.text
        for p in other_side:
            assert f"rank {p} on node{other} unreachable: dead, stopped, or the network to it " \
                   "is down" in report.text
        for p in set(report.states) - other_side:
            assert report.states[p] == "gone" and reports[p].when < report.when, report.text
    assert code not in (None, 0), code


# --- two jobs at once on one machine --------------------------------------

def test_two_jobs_at_once_do_not_share_memory_names(launcher):
    cluster = launcher.cluster(2, "1gbit")
    argv = launcher.cluster_argv(cluster, 2, SLOW_SCRIPT, "job_identity")  # 4 ranks
    procs = [subprocess.Popen(argv + [str(job)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=TESTS_DIR,
                              env=launcher.cluster_env()) for job in (1, 2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for job, (p, (out, err)) in enumerate(zip(procs, outputs), start=1):
        assert p.returncode == 0, err[-3000:]
        # Each job's sums come from its own ranks only (job 1 adds 1s, job 2
        # adds 2s): shared segments of the two jobs never mixed.
        assert out.count(f"RESULT job_identity {job} ok") == 4, out[-3000:]
