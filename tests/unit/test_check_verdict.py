"""The first-contact check's verdict (keras_ddl.check.verdict) on made-up
tables: each rule names what it should and nothing else; and the probe port
the check prints, read from this process's own core (a world of one)."""

import socket

import pytest

from keras_ddl.check.__main__ import parse_args
from keras_ddl.check.verdict import (MIB, RankRecord, format_rows, problems, shm_needed,
                                     slow_nodes)


def ranks(hosts, per_node=1, **fields):
    return [RankRecord(host=h, rank=i * per_node + j, local_rank=j, local_size=per_node,
                       shm_free=fields.get("shm_free", 8 << 30),
                       rack=fields.get("rack", ""), rack_source=fields.get("source", ""),
                       probe_port=40000 + i * per_node + j,
                       settings=dict(fields.get("settings", {})))
            for i, h in enumerate(hosts) for j in range(per_node)]


HOSTS = ["node1", "node2", "node3", "node4"]
FAST = {"node1": 110e6, "node2": 112e6, "node3": 108e6, "node4": 111e6}


def test_a_healthy_cluster_has_no_problem():
    assert problems(ranks(HOSTS, 2), FAST) == []


def test_the_node_below_half_the_median_is_named_and_only_it():
    rates = dict(FAST, node3=40e6)
    assert slow_nodes(rates) == ["node3"]
    found = problems(ranks(HOSTS), rates)
    assert len(found) == 1 and found[0].startswith("slow link: node node3 "), found
    # 60% of the median is not slow; two nodes cannot say which end is.
    assert slow_nodes(dict(FAST, node3=66e6)) == []
    assert slow_nodes({"node1": 100e6, "node2": 10e6}) == []


def test_a_rank_without_a_rack_when_others_have_one():
    records = ranks(HOSTS, rack="rack1", source="SLURM_TOPOLOGY_ADDR")
    records[2].rack = ""
    found = problems(records, FAST)
    assert found == [f"no rack: rank 2 on node3 has no rack while rank 0 on node1 is in rack "
                     f"rack1 (SLURM_TOPOLOGY_ADDR)"]
    # Nobody with a rack is not a problem: the job just runs without racks.
    assert problems(ranks(HOSTS), FAST) == []


def test_shm_too_small_for_the_staging_area_is_named_once_per_host():
    assert shm_needed(4, {}) == 64 * MIB
    assert shm_needed(4, {"DDL_SHM_ARENA_MB": "8"}) == 8 * MIB
    assert shm_needed(1, {}) == 0 and shm_needed(4, {"DDL_ALLREDUCE": "flat"}) == 0
    records = ranks(HOSTS, 4)
    for r in records:
        if r.host == "node2":
            r.shm_free = 63 * MIB
    found = problems(records, FAST)
    assert len(found) == 1 and found[0].startswith("/dev/shm too small: node2 had 63.0 MiB"), found
    # The same node with the arena capped fits.
    for r in records:
        r.settings["DDL_SHM_ARENA_MB"] = "16"
    assert problems(records, FAST) == []


def test_hosts_with_different_settings_are_named_per_value():
    records = ranks(HOSTS, settings={"DDL_CYCLE_TIME_MS": "1"})
    records[3].settings["DDL_CYCLE_TIME_MS"] = "5"
    records[1].settings["DDL_LOCAL_RANK"] = "1"  # a per-rank value: not a mismatch
    del records[0].settings["DDL_CYCLE_TIME_MS"]
    found = problems(records, FAST)
    assert found == ["different settings: DDL_CYCLE_TIME_MS is (unset) on node1; "
                     "1 on node2, node3; 5 on node4"], found


def test_a_rank_without_a_probe_port_is_named():
    records = ranks(HOSTS, 2)
    records[5].probe_port = 0
    assert problems(records, FAST) == [
        "no probe port: rank 5 on node3 could not open its probe port: when a collective "
        "waits long, the other ranks will take it for unreachable, as a dead rank (see "
        "docs/failures.md)"]


def test_the_probe_port_is_where_this_process_answers_probes():
    """basics.probe_port() (the check's probe_port=) is the core's probe
    responder: it accepts a connection on loopback and, given a wrong
    secret, closes it without a byte (docs/failures.md)."""
    from keras_ddl.common import basics
    basics.init()
    port = basics.probe_port()
    assert 0 < port < 65536
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"not the secret!!")
        assert s.recv(64) == b""


def test_rows_are_aligned_under_their_header():
    lines = format_rows(["size", "time_us"], [{"size": 4096, "time_us": 12.5},
                                              {"size": 16777216, "time_us": 2345.678}])
    assert lines == ["#     size  time_us", "      4096   12.500", "  16777216   2345.7"]


@pytest.mark.parametrize("argv, named", [
    (["--reps", "0"], "--reps: 0"), (["--min-bytes", "1m", "--max-bytes", "64k"], "--min-bytes"),
    (["--link-bytes", "100"], "--link-bytes: 100"), (["--max-bytes", "12q"], "'12q'")])
def test_options_that_cannot_run_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert named in capsys.readouterr().err
    assert parse_args(["--max-bytes", "1m"]).max_bytes == 1 << 20
