"""Racks on the test cluster: one launch of 2 racks x 2 nodes x 1 rank
(node links 400 Mbit/s, uplinks 100 Mbit/s; tests/mpi/scripts/racks_cluster_job.py).
The ranks learn their racks from Slurm's variables, results are bitwise in
the promised order, and each uplink carried what the rack allreduce must
send across it, 2(R-1)/R of the buffer per rack, and not much more: a flat
schedule over the 4 nodes would send about 1.75x that (pairwise
reduce-scatter: half of every buffer; ring all-gather: three quarters).
Then, in the same launch, the ranks are told no racks and not to probe (a
second init without Slurm's variables, DDL_TOPOLOGY=unknown): they say so,
large calls take the chain in rank order, results are bitwise in rank
order, and the chain crosses each uplink with the buffer once each way, as
the rack allreduce does here. Last, told nothing at all, the ranks probe by
default: every rank holds rank 0's measured verdict, racks only when they
are the right ones (never one switch behind these uplinks), and rank 0
prints its table."""

import json
import re

import pytest
from launching import CaseRun, case_names

pytestmark = pytest.mark.usefixtures("needs_netns")

SCRIPT = "racks_cluster_job.py"
_RUN = {}


def racks_run(launcher):
    if "run" in _RUN:
        return _RUN["run"]
    from keras_ddl_tools.cluster import NetnsCluster
    with NetnsCluster(2, "400mbit", racks=2, uplink="100mbit") as cluster:  # 4 nodes
        proc, uplinks = launcher.on_cluster(cluster, 1, SCRIPT,
                                            env={"DDL_TEST_REPORT_TRAFFIC": "1"}, timeout=400,
                                            counters="uplink_bytes")
    _RUN["run"] = (proc, CaseRun(4, proc, SCRIPT), uplinks)
    return _RUN["run"]


@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_racks_on_the_cluster(launcher, name):
    racks_run(launcher)[1].check(name)


def test_uplinks_carried_what_the_rack_allreduce_sends_across(launcher):
    proc, _, uplinks = racks_run(launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(m.group(1)) for m in re.finditer(r"^DDLTRAFFIC (.*)$", proc.stdout,
                                                           re.MULTILINE)]
    assert len(records) == 8, proc.stdout[-2000:]
    told = [r for r in records if r["algorithm"] == "racks"]
    untold = [r for r in records if r["algorithm"] == "flat"]
    assert len(told) == 4 and len(untold) == 4, records
    # Told: every rank's rack_bytes counts the buffers it allreduced; each
    # node sends 2(R-1)/R of 1/N of them through its rack's uplink.
    racks, per_rack = 2, 2
    payload = told[0]["rack_bytes"] * 2 * (racks - 1) / racks
    assert payload > 48e6, records  # the three 16 MB calls at least
    # Untold: the chain's partials cross from node2 to node3 and the
    # results back, each buffer once each way (flat_bytes: the buffers;
    # the direct exchange of the small calls adds a few kilobytes). The
    # pairwise schedule would have sent 1.75x those buffers, which would
    # put the whole launch at about 1.37x `payload` below.
    chained = untold[0]["flat_bytes"]
    assert chained > 48e6, records
    payload += chained
    # Last, the default probe: its sizing rounds at distance 2 send 2
    # messages across each uplink each way, doubled from 256 KiB until the
    # slowest takes 20 ms (at 12.5 MB/s shared by 2: 512 KiB at most, the
    # token bucket's burst included); then in rounds d = 1, 2, 3 a pass
    # sends 1, 2 and 1 messages of that size across, up to 3 passes.
    probe = 2 * ((256 << 10) + (512 << 10)) + 3 * 4 * (512 << 10)
    for rack, (out, arrived) in enumerate(uplinks):
        assert payload <= out <= 1.2 * payload + probe, (rack, out, arrived, payload)
        assert payload <= arrived <= 1.2 * payload + probe, (rack, out, arrived, payload)


def test_the_probe_printed_what_it_measured(launcher):
    """Rank 0's table: every pair's rate and the verdict, with its time."""
    proc, _, _ = racks_run(launcher)
    # What the untold and probe parts add to the launch (shown with -rP).
    print("\n".join(re.findall(r"^DDLPART .*$", proc.stdout, re.M)))
    # Printed once: by default only with DDL_PRINT_TOPOLOGY=1 (the third part).
    assert proc.stderr.count("keras_ddl topology probe:") == 1, proc.stderr[-3000:]
    at = proc.stderr.find("keras_ddl topology probe: 4 nodes")
    assert at >= 0, proc.stderr[-3000:]
    table = proc.stderr[at:]
    assert re.search(r"pair rates in MB/s.*\n.*node 3 \(p\d\)", table, re.S), table[:2000]
    assert re.search(r"verdict: (racks|unclear)", table), table[:2000]
    assert re.search(r"\[keras_ddl\] topology: no topology given, so the node leaders probed",
                     table), table[:3000]
