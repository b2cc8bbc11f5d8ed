"""The alpha-beta scaling model (keras_ddl_tools/scaling_model/): formulas against
hand-computed values, properties of the predictions, the published points
and the command line. Single process, no TensorFlow, a few seconds."""

import json
import os
import re
import sys

import pytest

from keras_ddl_tools import scaling_model as m

A, B = 7e-6, 1 / 5e9           # a link: 7 us, 5 GB/s
LINK = m.Link(alpha=A, bandwidth=5e9)
S = 100 * 2**20                  # 100 MiB


# --- formulas ---------------------------------------------------------------

def test_ring_n4_is_six_steps_of_a_quarter():
    assert m.ring_allreduce(4, S, LINK) == pytest.approx(2 * 3 * (A + S / 4 * B), rel=1e-12)


def test_ring_and_halving_doubling_of_one_rank_cost_nothing():
    for fn in (m.ring_allreduce, m.halving_doubling_allreduce, m.multi_ring_allreduce):
        assert fn(1, S, LINK) == 0.0


def test_halving_doubling_power_of_two():
    # 2*log2(8) latencies, 2*(n-1)/n of the bytes
    expected = 2 * 3 * A + 2 * (7 / 8) * S * B
    assert m.halving_doubling_allreduce(8, S, LINK) == pytest.approx(expected, rel=1e-12)
    # step by step: S/2, S/4, S/8 in each phase
    steps = 2 * sum(A + S / 2**k * B for k in (1, 2, 3))
    assert m.halving_doubling_allreduce(8, S, LINK) == pytest.approx(steps, rel=1e-12)


def test_halving_doubling_non_power_of_two_folds():
    # 6 ranks: the 2 extra ranks fold into 4 (one full message in, one out)
    expected = m.halving_doubling_allreduce(4, S, LINK) + 2 * (A + S * B)
    assert m.halving_doubling_allreduce(6, S, LINK) == pytest.approx(expected, rel=1e-12)


def test_multi_ring_has_ring_bytes_and_fewer_latencies():
    # 16 ranks as 4 x 4
    expected = 2 * (3 * (A + S / 4 * B) + 3 * (A + S / 16 * B))
    assert m.multi_ring_allreduce(16, S, LINK) == pytest.approx(expected, rel=1e-12)
    no_latency = m.Link(alpha=0.0, bandwidth=5e9)
    assert m.multi_ring_allreduce(16, S, no_latency) == pytest.approx(
        m.ring_allreduce(16, S, no_latency), rel=1e-12)


def test_hierarchical_hand_computed():
    intra = m.Link(alpha=2e-6, bandwidth=20e9)
    inter = m.Link(alpha=5e-6, bandwidth=10e9)
    # 8 ranks = 2 nodes x 4: reduce-scatter + all-gather of 3 steps of S/4 in a node;
    # cross-node ring on 2 nodes of the S/4 shard, 4 shards sharing each node's link
    rs = 3 * (2e-6 + S / 4 / 20e9)
    cross = 2 * 1 * (5e-6 + (S / 4) / 2 * 4 / 10e9)
    assert m.hierarchical(8, 4, S, intra, inter) == pytest.approx(2 * rs + cross, rel=1e-12)
    # in one node it is the intra-node ring
    assert m.hierarchical(4, 4, S, intra, inter) == pytest.approx(
        m.ring_allreduce(4, S, intra), rel=1e-12)
    # halving-doubling across nodes
    cross_hd = 2 * (5e-6 + (S / 4) / 2 * 4 / 10e9)
    assert m.hierarchical(8, 4, S, intra, inter, cross="halving_doubling") == pytest.approx(
        2 * rs + cross_hd, rel=1e-12)


def test_flat_ring_across_nodes_is_paced_by_the_slowest_hop():
    intra = m.Link(alpha=2e-6, bandwidth=20e9)
    inter = m.Link(alpha=5e-6, bandwidth=10e9)
    step = max(2e-6 + S / 16 / 20e9, 5e-6 + S / 16 / 10e9)
    assert m.flat_ring(16, 8, S, intra, inter) == pytest.approx(2 * 15 * step, rel=1e-12)


def test_flat_halving_doubling_shares_the_node_link():
    intra = m.Link(alpha=2e-6, bandwidth=20e9)
    inter = m.Link(alpha=5e-6, bandwidth=10e9)
    # 8 ranks, 2 per node: distance 1 in the node (S/2), distances 2 and 4 across
    # nodes (S/4, S/8) with both ranks of a node on its link at once
    expected = 2 * ((2e-6 + S / 2 / 20e9) + (5e-6 + S / 4 * 2 / 10e9)
                    + (5e-6 + S / 8 * 2 / 10e9))
    assert m.flat_halving_doubling(8, 2, S, intra, inter) == pytest.approx(expected, rel=1e-12)


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="do not fill nodes"):
        m.hierarchical(12, 8, S, LINK, LINK)
    with pytest.raises(ValueError, match="unknown algorithm"):
        m.allreduce_time("tree", 8, 4, S, LINK, LINK)
    with pytest.raises(ValueError, match="cross-node"):
        m.hierarchical(8, 4, S, LINK, LINK, cross="tree")
    with pytest.raises(ValueError, match="positive integer"):
        m.ring_allreduce(0, S, LINK)
    with pytest.raises(ValueError, match="unknown model"):
        m.workload("vgg16")


def test_hierarchical_beats_flat_ring_when_the_network_is_slow():
    intra = m.Link(alpha=5e-6, bandwidth=40e9)
    inter = m.Link(alpha=20e-6, bandwidth=1e9)     # network 40x slower than the node
    for n in (16, 64, 256):
        assert m.hierarchical(n, 8, S, intra, inter) < m.flat_ring(n, 8, S, intra, inter)
    # and with a uniform network and no latency the flat ring is not worse
    flat = m.Link(alpha=0.0, bandwidth=10e9)
    assert m.flat_ring(16, 8, S, flat, flat) <= m.hierarchical(16, 8, S, flat, flat)


# --- workloads ----------------------------------------------------------------

def test_resnet_gradient_lists():
    r50, r101, r22k = (m.workload(n) for n in ("resnet50", "resnet101", "resnet101-22k"))
    assert r50.params == 25_557_032 and len(r50.tensors) == 161
    assert r50.nbytes == pytest.approx(102.2e6, rel=1e-3)
    assert r101.params == 44_549_160
    assert 3.8e9 < r50.macs < 3.9e9 and 7.5e9 < r101.macs < 7.7e9
    # the 22k-class head adds 2048 * 20841 weights and 20841 biases
    assert r22k.params - r101.params == 2049 * (21841 - 1000)
    for w in (r50, r101, r22k):
        assert sum(t.nbytes for t in w.tensors) == w.nbytes
        ready = [t.ready for t in w.tensors]
        assert ready == sorted(ready) and 0 < ready[0] and ready[-1] == pytest.approx(1.0)
        assert w.tensors[0].name.startswith("fc")      # the last layer's gradient comes first


def test_buckets_cover_every_byte_once():
    work = m.workload("resnet50")
    base = m.SYSTEMS["keras_ddl"]
    t = base.step_compute(work)
    for policy, count in (("tensor", 161), ("layer", 54), ("single", 1), ("cycle", None)):
        calls = m.buckets(base.with_(fusion=policy), work, t)
        assert sum(b for _, b in calls) == work.nbytes
        assert [r for r, _ in calls] == sorted(r for r, _ in calls)
        if count is not None:
            assert len(calls) == count
        assert all((1 - base.backward_fraction) * t <= r <= t + base.cycle for r, _ in calls)
    capped = m.buckets(base.with_(fusion="cycle", cycle=1.0, fusion_bytes=8 << 20), work, t)
    assert max(b for _, b in capped) <= max(8 << 20, max(x.nbytes for x in work.tensors))


# --- the step model -------------------------------------------------------------

def test_one_gpu_is_perfectly_efficient():
    for system in m.SYSTEMS.values():
        r = m.simulate_step(system, m.workload("resnet50"), 1)
        assert r.exposed == 0.0 and r.efficiency == 1.0


def test_overlap_fraction_bounds():
    work = m.workload("resnet50")
    system = m.SYSTEMS["goyal2017"]
    none = m.simulate_step(system.with_(overlap_fraction=0.0), work, 256)
    full = m.simulate_step(system.with_(overlap_fraction=1.0), work, 256)
    part = m.simulate_step(system, work, 256)
    assert none.exposed == pytest.approx(none.t_comm)          # nothing hidden
    assert full.exposed < 0.05 * full.t_comm                    # only the tail
    assert full.exposed < part.exposed < none.exposed
    assert part.efficiency == pytest.approx(part.t_compute / (part.t_compute + part.exposed))


@pytest.mark.parametrize("name", sorted(m.SYSTEMS))
def test_efficiency_never_rises_with_more_gpus(name):
    gpus = [2**k for k in range(11)]
    for model in m.MODELS:
        work = m.workload(model)
        for algorithm in m.ALGORITHMS:
            eff = [m.simulate_step(m.SYSTEMS[name], work, n, algorithm).efficiency
                   for n in gpus]
            assert all(b <= a + 1e-12 for a, b in zip(eff, eff[1:])), (model, algorithm, eff)


def test_more_network_bandwidth_never_hurts():
    work = m.workload("resnet50")
    base = m.SYSTEMS["powerai_ddl2017"]
    effs = [m.simulate_step(base.with_(inter=m.Link(5e-6, bw * 1e9)), work, 256).efficiency
            for bw in (1, 3, 10, 30)]
    assert effs == sorted(effs) and effs[0] < effs[-1]


def test_published_points_within_five_points():
    rows = m.compare_published()
    assert len(rows) == 3
    for row in rows:
        assert abs(row["predicted"] - row["published"]) <= 0.05, row
        assert row["within_5"]


def test_published_points_need_similar_overlap():
    # one overlap fraction serves all three points: what each would need on its
    # own lies within 0.2 of the shared value
    for p in m.PUBLISHED:
        assert abs(m.overlap_needed(p) - m.OVERLAP_FRACTION) <= 0.2, p


# --- calibration, plot, command line ------------------------------------------------

def test_calibrate_single_process():
    measured = m.calibrate(copy_bytes=4 << 20, reps=2)
    assert measured["ranks"] == 1 and measured["copy_GBps"] > 0
    system = m.calibrated_system(m.SYSTEMS["keras_ddl"], measured)
    assert system.intra.bandwidth == pytest.approx(
        measured["copy_GBps"] * 1e9 / m.SHM_TRAFFIC_PER_COPY)
    assert system.intra.alpha == m.SYSTEMS["keras_ddl"].intra.alpha   # no MPI: default kept


def test_plot_is_skipped_with_a_warning_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    system = m.SYSTEMS["keras_ddl"]
    work = m.workload("resnet50")
    rows = [r.row() for r in m.predict(system, work, [8, 16])]
    with pytest.warns(UserWarning, match="matplotlib"):
        assert not m.plot(str(tmp_path / "x.png"), system, work, [8, 16], rows,
                          m.compare_published(), m.SYSTEMS)
    assert not (tmp_path / "x.png").exists()


def _run_cli(argv, capsys):
    from keras_ddl_tools.bench.__main__ import main
    main(argv)
    return capsys.readouterr().out


def test_cli_prints_both_tables(capsys, tmp_path):
    out = _run_cli(["model", "--gpus", "8,16,32", "--algorithms", "ring,hierarchical",
                    "--json", str(tmp_path / "m.json")], capsys)
    lines = out.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("# scaling model"))
    columns = lines[header + 1].split()
    assert columns == m.TABLE_COLUMNS
    body = lines[header + 2:header + 8]
    assert [l.split()[0] for l in body] == ["8", "8", "16", "16", "32", "32"]
    assert [l.split()[2] for l in body[:2]] == ["ring", "hierarchical"]
    for l in body:
        assert 0 < float(l.split()[-1]) <= 1
    assert "# published vs predicted" in out
    assert lines[lines.index(next(l for l in lines if l.startswith("# published"))) + 1].split() \
        == m.PUBLISHED_COLUMNS
    assert "# parameters:" in out
    payload = json.loads((tmp_path / "m.json").read_text())
    assert [r["gpus"] for r in payload["predictions"]] == [8, 8, 16, 16, 32, 32]
    assert len(payload["published"]) == 3 and payload["calibration"] is None


def test_cli_other_system_model_and_overrides(capsys):
    out = _run_cli(["model", "--system", "powerai_ddl2017", "--model", "resnet101",
                    "--gpus", "4,8", "--gpus-per-node", "4", "--overlap", "0.5"], capsys)
    assert "powerai_ddl2017, resnet101" in out and "overlap fraction" in out
    assert "0.5" in out


def test_cli_rejects_bad_input(capsys):
    for argv in (["model", "--gpus", "8,x"], ["model", "--gpus", "12"],
                 ["model", "--algorithms", "tree"], ["model", "--overlap", "2"]):
        with pytest.raises(SystemExit):
            _run_cli(argv, capsys)


def test_overlap_fraction_refit_from_a_cluster_fit_result():
    rate = 1e9
    at = m.simulate_step(m.test_cluster_system(rate, 1.0), m.workload("resnet50"), 2)
    fit = {"rows": [
        {"overlap": "on", "wire": "fp32", "1rank_ms": 1000.0, "2x1_ms": 1000.0 / at.efficiency_at(0.4),
         "efficiency": at.efficiency_at(0.4)},
        {"overlap": "off", "wire": "fp32", "1rank_ms": 1000.0, "2x1_ms": 3333.3, "efficiency": 0.3},
        {"overlap": "on", "wire": "fp16", "1rank_ms": 1000.0, "2x1_ms": 5000.0, "efficiency": 0.2}]}
    rows = m.overlap_from_fit(fit, rate)
    assert [r["wire"] for r in rows] == ["fp32", "fp16"]  # overlap off: f = 0 by definition
    assert [r["against"] for r in rows] == ["1 rank", "1 rank"]
    assert rows[0]["fitted_f"] == pytest.approx(0.4, abs=0.011)
    assert rows[0]["model_f0"] < rows[0]["measured"] < rows[0]["model_f1"]
    # Half the bytes on the wire: better bounds; a measurement below what no
    # overlap at all predicts is fitted as 0.
    assert rows[1]["model_f0"] > rows[0]["model_f0"]
    assert rows[1]["fitted_f"] == 0.0


def test_link_rates_parse():
    assert m.parse_rate("1gbit") == 1e9
    assert m.parse_rate("100MBIT") == 1e8
    assert m.parse_rate("2.5gbit") == 2.5e9
    for bad in ("fast", "gbit", "10gb", "-1gbit"):
        with pytest.raises(ValueError, match=f"rate={bad!r}: expected a positive number"):
            m.parse_rate(bad)


def test_overlap_fraction_refit_uses_the_control_run_when_present():
    # Independent ranks took 1100 ms a step against 990 alone (machine 0.9):
    # the fit is on communication = independent / distributed, with the
    # independent step as compute, so the machine's share is not counted
    # as overlap that failed.
    rate = 1e9
    at = m.simulate_step(m.test_cluster_system(rate, 1.1), m.workload("resnet50"), 2)
    communication = at.efficiency_at(0.5)
    fit = {"rows": [{"overlap": "on", "wire": "fp32", "1rank_ms": 990.0,
                     "2x1_ms": 1100.0 / communication, "2x1_indep_ms": 1100.0,
                     "machine": 0.9, "communication": communication,
                     "efficiency": 0.9 * communication}]}
    (row,) = m.overlap_from_fit(fit, rate)
    assert row["against"] == "independent" and row["measured"] == communication
    assert row["fitted_f"] == pytest.approx(0.5, abs=0.011)
    # Fitted on efficiency instead, the machine's 10% would read as less overlap.
    legacy = {"rows": [{k: v for k, v in fit["rows"][0].items()
                        if k not in ("communication", "2x1_indep_ms", "machine")}]}
    assert m.overlap_from_fit(legacy, rate)[0]["fitted_f"] < row["fitted_f"] - 0.1
    # A result of another shape (3 nodes) is refused by name, not misread.
    three = {"rows": [{"overlap": "on", "wire": "fp32", "1rank_ms": 990.0, "3x1_ms": 1500.0,
                       "efficiency": 0.66}]}
    with pytest.raises(ValueError, match="2 nodes x 1 rank; this result has no 2x1_ms"):
        m.overlap_from_fit(three, rate)


# --- racks: the three-level allreduce, uplinks, the seeds' scale -----------------------

def test_racks_oversubscription_and_bound():
    r = m.Racks(racks=2, nodes_per_rack=16, node_rate=12.5e9, uplink_rate=50e9)
    assert r.nodes == 32 and r.oversubscription == pytest.approx(4.0)
    S = 8e6
    assert r.node_term(S) == pytest.approx(2 * 31 / 32 * S / 12.5e9)
    assert r.uplink_term(S) == pytest.approx(2 * 1 / 2 * S / 50e9)
    assert r.bound(S) == max(r.node_term(S), r.uplink_term(S))
    assert r.stage_links() == ["node", "uplink", "uplink", "node"]
    assert m.Racks(1, 4, 1e9, 1e9).stage_links() == ["node", "node"]
    assert m.Racks(4, 1, 1e9, 1e9).stage_links() == ["uplink", "uplink"]


def test_rack_allreduce_four_pieces_by_hand():
    # 2 racks x 2 nodes, nodes 1 GB/s, uplinks 0.25 GB/s, 4 MB in 4 pieces of 1 MB.
    # node_term = 2*3/4*4e6/1e9 = 6 ms -> 0.75 ms per node round of a piece;
    # uplink_term = 2*1/2*4e6/0.25e9 = 16 ms -> 2 ms per uplink round of a piece.
    racks = m.Racks(2, 2, 1e9, 0.25e9)
    assert racks.bound(4e6) == pytest.approx(16e-3)
    # Stages: the uplinks are busy 16 ms from the end of the first piece's A
    # (0.75 ms) to the start of the last piece's D (0.75 ms); 4 latencies
    assert m.rack_allreduce(racks, 4e6, alpha=1e-5, piece=1e6) == pytest.approx(
        16e-3 + 1.5e-3 + 4e-5, rel=1e-12)
    # 16 pieces: the fill and drain shrink to 2 x 0.1875 ms
    assert m.rack_allreduce(racks, 4e6, piece=0.25e6) == pytest.approx(16.375e-3, rel=1e-12)
    # Lockstep (before 0446f4a), steps (A B C D active):
    # A | A B | A B C | A B C D | B C D | C D | D
    # node load:   .75  .75  .75  1.5  .75  .75  .75 ; uplink: 0 2 4 4 4 2 0
    # step = max -> .75 + 2 + 4 + 4 + 4 + 2 + .75 = 17.5 ms, plus 7 latencies
    assert m.rack_allreduce(racks, 4e6, alpha=1e-5, piece=1e6,
                            schedule="lockstep") == pytest.approx(17.5e-3 + 7e-5, rel=1e-12)
    with pytest.raises(ValueError, match="unknown rack schedule"):
        m.rack_allreduce(racks, 4e6, schedule="steps")


def test_rack_allreduce_node_bound_drains_the_last_pieces_uplink_rounds():
    # 2 racks x 4 nodes, equal rates: node_term = 2*7/8*8e6/1e9 = 14 ms,
    # uplink_term = 2*1/2*8e6/1e9 = 8 ms; 8 pieces: the last piece's B and C
    # after the node links' 14 ms, 2 x 0.5 ms
    racks = m.Racks(2, 4, 1e9, 1e9)
    assert m.rack_allreduce(racks, 8e6, piece=1e6) == pytest.approx(15e-3, rel=1e-12)
    # lockstep (node .875 ms per round, uplink .5): 11 steps, A | AB | ABC | 5 x ABCD |
    # BCD | CD | D = .875 + .875 + 1 + 5 x 1.75 + 1 + .875 + .875 = 14.25 ms. The stages
    # model is the dearer here: it charges the last piece's B and C whole, where the
    # node links may still have D rounds of earlier pieces to run meanwhile
    assert m.rack_allreduce(racks, 8e6, piece=1e6, schedule="lockstep") == pytest.approx(
        14.25e-3, rel=1e-12)


def test_rack_allreduce_one_piece_is_the_sum_of_its_stages():
    # 2 racks x 4 nodes, equal rates, one piece: A .875 + B .5 + C .5 + D .875 ms,
    # whichever schedule
    racks = m.Racks(2, 4, 1e9, 1e9)
    for schedule in m.SCHEDULES:
        assert m.rack_allreduce(racks, 1e6, alpha=1e-6, piece=1e6,
                                schedule=schedule) == pytest.approx(2.754e-3, rel=1e-12)


def test_rack_allreduce_one_rack_reaches_the_node_bound():
    # one rack of 4: A and D on the node links; 8 pieces: exactly
    # 2*3/4*8e6/1e9 = 12 ms in both schedules (lockstep: half a step of fill,
    # half of drain, 7 full steps)
    racks = m.Racks(1, 4, 1e9, 1e9)
    for schedule in m.SCHEDULES:
        assert m.rack_allreduce(racks, 8e6, piece=1e6,
                                schedule=schedule) == pytest.approx(12e-3, rel=1e-12)
    # one node per rack: B and C load node link and uplink alike, no fill
    assert m.rack_allreduce(m.Racks(4, 1, 1e9, 0.5e9), 8e6, piece=1e6) == pytest.approx(
        2 * 3 / 4 * 8e6 / 0.5e9, rel=1e-12)
    # large calls approach the bound of the slowest dimension
    big = m.Racks(4, 16, 12.5e9, 12.5e9)
    S = 1e9
    assert m.rack_allreduce(big, S) == pytest.approx(big.bound(S), rel=0.01)
    assert m.rack_allreduce(big, 0) == 0.0 and m.rack_allreduce(m.Racks(1, 1, 1, 1), S) == 0.0


def test_three_level_adds_the_node_stage_and_shares_the_links():
    intra = m.Link(alpha=2e-6, bandwidth=20e9)
    inter = m.Link(alpha=5e-6, bandwidth=10e9)
    uplink = m.Link(alpha=5e-6, bandwidth=20e9)
    S = 16 * 2**20
    # 4 racks x 2 nodes x 2 GPUs: 4 shared-memory chunks of 4 MiB, each a rack
    # allreduce of its own on the two GPUs' 2 MiB slices in 8 pieces of 256 KiB;
    # the two grids share each node's link: the grid sees the node's 4 MiB
    grid = m.Racks(4, 2, 10e9, 20e9)
    chunk = m.rack_allreduce(grid, 4 * 2**20, 5e-6, pieces=8)
    expected = 2 * m.ring_reduce_scatter(2, S, intra) + 4 * chunk
    assert m.three_level(16, 2, S, intra, inter, uplink, 2) == pytest.approx(expected, rel=1e-12)
    assert m.allreduce_time("racks", 16, 2, S, intra, inter, uplink=uplink,
                            nodes_per_rack=2) == pytest.approx(expected, rel=1e-12)
    # a call of 5 MiB: a full chunk and one of 1 MiB (slices of 512 KiB, 8 pieces)
    assert m.three_level(16, 2, 5 * 2**20, intra, inter, uplink, 2) == pytest.approx(
        2 * m.ring_reduce_scatter(2, 5 * 2**20, intra) + chunk
        + m.rack_allreduce(grid, 2**20, 5e-6, pieces=8), rel=1e-12)
    with pytest.raises(ValueError, match="do not fill racks"):
        m.three_level(16, 2, S, intra, inter, uplink, 3)


def test_rack_pieces_are_1_mib():
    # RackPieceBytes in custom_ops/algorithms/rack_allreduce.h and its
    # checks in tests/core/rack_allreduce_check.cc, as piece counts
    MiB = 1 << 20
    assert m.rack_pieces(0) == 1 and m.rack_pieces(1) == 1
    assert m.rack_pieces(300 << 10) == 1          # a smaller call is one piece
    assert m.rack_pieces(1.5 * MiB) == 2
    assert m.rack_pieces(64 * MiB) == 64
    assert m.rack_pieces(64 * MiB + 1) == 65
    assert m.rack_pieces(1 << 30) == 1024
    # the rule of 0446f4a until fixed pieces: a 32nd within 1-2 MiB
    assert m.rack_pieces(48 * MiB, 32, MiB, 2 * MiB) == 32
    assert m.rack_pieces(64 * MiB + 1, 32, MiB, 2 * MiB) == 33
    # the lockstep schedule's rule (6b9f4ab..0446f4a): an eighth within 1-8 MiB
    assert m.lockstep_pieces(4 * MiB) == 4 and m.lockstep_pieces(64 * MiB) == 8
    assert m.lockstep_pieces(64 * MiB + 1) == 9 and m.lockstep_pieces(1 << 30) == 128
    # the rack allreduce takes its schedule's rule unless told a piece size or count
    grid = m.Racks(2, 4, 1e9, 0.25e9)
    for S in (3 * MiB, 40 * MiB, 100 * MiB):
        assert m.rack_allreduce(grid, S, 1e-5) == m.rack_allreduce(grid, S, 1e-5,
                                                                   pieces=m.rack_pieces(S))
        assert m.rack_allreduce(grid, S, 1e-5, schedule="lockstep") == m.rack_allreduce(
            grid, S, 1e-5, pieces=m.lockstep_pieces(S), schedule="lockstep")
    assert m.rack_allreduce(grid, 40 * MiB, 1e-5, piece=MiB) == m.rack_allreduce(
        grid, 40 * MiB, 1e-5, pieces=40)


def test_slice_pieces_are_an_eighth_of_the_slice_within_64_kib_to_2_mib():
    # NodeAllreduce::CrossNode (custom_ops/algorithms/node_allreduce.cc): a
    # local rank's slice of a shared-memory chunk
    KiB, MiB = 1 << 10, 1 << 20
    assert m.slice_pieces(0) == 1 and m.slice_pieces(64 * KiB) == 1
    assert m.slice_pieces(256 * KiB) == 4         # the 64 KiB floor
    assert m.slice_pieces(512 * KiB) == 8         # a 4 MiB chunk over 8 GPUs
    assert m.slice_pieces(16 * MiB) == 8          # pieces of 2 MiB
    assert m.slice_pieces(16 * MiB + 1) == 9      # the 2 MiB cap (was 8 MiB)
    assert m.RACK_CHUNK_BYTES == 4 * MiB


def test_three_level_cuts_each_slice_by_the_rule():
    intra = m.Link(alpha=2e-6, bandwidth=20e9)
    inter = m.Link(alpha=5e-6, bandwidth=10e9)
    uplink = m.Link(alpha=5e-6, bandwidth=20e9)
    S = 128 * 2**20
    grid = m.Racks(4, 2, 10e9, 20e9)
    # one GPU per node: the call in the rule's 128 pieces of 1 MiB, or 2 MiB pieces (64)
    assert m.three_level(8, 1, S, intra, inter, uplink, 2) == pytest.approx(
        m.rack_allreduce(grid, S, 5e-6, pieces=128), rel=1e-12)
    assert m.three_level(8, 1, S, intra, inter, uplink, 2, piece=2**21) == pytest.approx(
        m.rack_allreduce(grid, S, 5e-6, pieces=64), rel=1e-12)
    assert m.three_level(8, 1, S, intra, inter, uplink, 2, schedule="lockstep") == (
        pytest.approx(m.rack_allreduce(grid, S, 5e-6, pieces=16, schedule="lockstep"),
                      rel=1e-12))
    # 2 GPUs per node: 32 chunks of 4 MiB, 2 MiB slices in 8 pieces each;
    # 1 MiB pieces: 2 per slice
    in_node = 2 * m.ring_reduce_scatter(2, S, intra)
    assert m.three_level(16, 2, S, intra, inter, uplink, 2) == pytest.approx(
        in_node + 32 * m.rack_allreduce(grid, 4 * 2**20, 5e-6, pieces=8), rel=1e-12)
    assert m.three_level(16, 2, S, intra, inter, uplink, 2, piece=2**20) == pytest.approx(
        in_node + 32 * m.rack_allreduce(grid, 4 * 2**20, 5e-6, pieces=2), rel=1e-12)


def test_observations_measured_with_fixed_pieces_keep_them():
    # the lab notes' rack rows ran with 1 MiB pieces: their bound says so
    obs = {"shape": "2x4x1", "rate": "1gbit", "uplink": "250mbit", "path": "racks",
           "size": 64 << 20, "time_s": 3.11}
    node, up = m.Link(0.0, 1e9 / 8), m.Link(0.0, 250e6 / 8)
    assert m.observation_bound(obs) == m.three_level(8, 1, 64 << 20, node, node, up, 4)
    assert m.observation_bound(dict(obs, piece=2 << 20)) == m.three_level(
        8, 1, 64 << 20, node, node, up, 4, piece=2 << 20)
    assert m.observation_bound(dict(obs, piece=2 << 20)) > m.observation_bound(obs)
    with open(m.OBSERVATIONS) as f:
        transcribed = json.load(f)["observations"]
    racks_rows = [o for o in transcribed if o["path"] == "racks"]
    assert racks_rows and all(o.get("piece") == 1 << 20 for o in racks_rows)
    # ... and the lockstep schedule of their time, which their bound takes
    assert all(o.get("schedule") == "lockstep" for o in racks_rows)
    assert m.observation_bound(racks_rows[0]) == m.three_level(
        8, 1, 64 << 20, node, node, up, 4, piece=1 << 20, schedule="lockstep")
    assert m.observation_bound(racks_rows[0]) != m.observation_bound(
        dict(racks_rows[0], schedule="stages"))


def test_results_files_measured_before_the_stages_schedule_are_refit_as_lockstep(tmp_path):
    from keras_ddl_tools import results
    launch = {"meta": {"date": "2026-12-05T00:00:00Z", "command": "c",
                       "machine": {"cores": 2}},
              "nodes": 8, "ranks_per_node": 1, "rate": "1gbit", "racks": 2,
              "uplink": "250mbit", "burst_bytes": 262144,
              "rows": [{"size": "64MB", "bound_us": 2.15e6, "auto_us": 2.5e6, "flat_us": 7e6,
                        "mpi_us": 5e6}]}
    old, new = "6b9f4ab6b6ac3cda6d0bc341f3ba0d74e2585162", "a" * 40
    for name, commit in (("racks_old.json", old), ("racks_new.json", new)):
        merged = results.merge([dict(launch, meta=dict(launch["meta"], commit=commit))],
                               name[:-5], "c", "test")
        assert merged["commits"] == [commit]
        results.save(merged, str(tmp_path / name))
    by_file = {o["source"].split(",")[0]: o for o in m.observations_from_results(str(tmp_path))}
    lock, stages = by_file["docs/results/racks_old.json"], by_file["docs/results/racks_new.json"]
    assert (lock["schedule"], stages["schedule"]) == ("lockstep", "stages")
    # 64 MiB at 1 Gbit/s / 250 Mbit/s, in units of S/B: uplink_term 4, node_term 1.75.
    # Lockstep, 8 pieces of 8 MiB (node round a = 1.75/16, uplink round u = 4/16):
    # A | AB | ABC | 5 x ABCD | BCD | CD | D = 2a + 2u + 7 x 2u = 4.21875;
    # stages, 64 pieces of 1 MiB: 4 + 1.75/64
    bound = m.Racks(2, 4, 1e9 / 8, 250e6 / 8).bound(64 << 20)
    assert bound / m.observation_bound(lock) == pytest.approx(4 / 4.21875, rel=1e-12)
    assert bound / m.observation_bound(stages) == pytest.approx(4 / (4 + 1.75 / 64),
                                                                 rel=1e-12)
    assert m.rack_schedule([old, "30d6a2ec974097cbe19ad8e48bc15dbaa87c6b58"]) == "lockstep"
    assert m.rack_schedule([old, new]) == "stages" and m.rack_schedule(None) == "stages"


def test_pairwise_cross_step_by_hand():
    inter = m.Link(alpha=0.0, bandwidth=1e9)
    uplink = m.Link(alpha=0.0, bandwidth=0.5e9)
    S = 8e6
    # 2 racks of 4: the reduce-scatter sends 4*4/8*S = 2S = 16 MB through each
    # uplink (32 ms; the node links need 7/8*S/1e9 = 7 ms); the ring all-gather
    # 7 steps of max(1 MB / 1 GB/s, 1 MB / 0.5 GB/s) = 2 ms
    assert m.pairwise_ring_cross(8, S, inter, uplink, 4) == pytest.approx(46e-3, rel=1e-12)
    # one switch: 7 ms + 7 x 1 ms, i.e. the bandwidth of a ring
    assert m.pairwise_ring_cross(8, S, inter) == pytest.approx(14e-3, rel=1e-12)
    with_alpha = m.Link(alpha=1e-5, bandwidth=1e9)
    assert m.pairwise_ring_cross(8, S, with_alpha) == pytest.approx(14e-3 + 14e-5, rel=1e-12)
    # behind uplinks the ring across nodes only sees them when they are slower
    assert m.ring_cross_racks(8, S, inter, uplink, 4) == pytest.approx(2 * 7 * 2e-3)
    assert m.hierarchical(8, 1, S, inter, inter, cross="pairwise", uplink=uplink,
                          nodes_per_rack=4) == pytest.approx(46e-3, rel=1e-12)
    with pytest.raises(ValueError, match="not modelled behind rack uplinks"):
        m.hierarchical(8, 1, S, inter, inter, cross="multi_ring", uplink=uplink,
                       nodes_per_rack=4)


def test_flat_ring_sees_a_slow_uplink():
    intra = m.Link(alpha=0.0, bandwidth=20e9)
    inter = m.Link(alpha=0.0, bandwidth=10e9)
    slow = m.Link(alpha=0.0, bandwidth=1e9)
    S = 64e6
    assert m.flat_ring(16, 2, S, intra, inter, slow, 4) == pytest.approx(2 * 15 * S / 16 / 1e9)
    assert m.flat_ring(16, 2, S, intra, inter) == pytest.approx(2 * 15 * S / 16 / 10e9)


def test_solve_rate_reaches_the_target():
    eff = lambda r: r / (r + 1e9)  # noqa: E731  (90% at 9 Gbit/s)
    rate = m.solve_rate(eff, 0.9)
    assert eff(rate) >= 0.9 and eff(rate / 1.002) < 0.9
    assert rate == pytest.approx(9e9, rel=2e-3)
    assert m.solve_rate(lambda r: 0.5, 0.9) is None
    assert m.solve_rate(lambda r: 0.95, 0.9) == 1e8
    # on a seed system: the solved server rate gives 90% within the tolerance
    setup = m.SeedSetup(seeds="p100", link_efficiency=0.9, call_overhead=300e-6)
    work = m.workload("resnet50")

    def at(r):
        return m.seed_efficiency(m.seed_system("p100_gpu", setup, node_rate=r), work, 256,
                                 "racks", "pairwise")
    rate = m.solve_rate(at, 0.9)
    assert at(rate) == pytest.approx(0.9, abs=0.002) and at(rate) >= 0.9


def _synthetic_observations(eff, overhead):
    shapes = [("2x1", "1gbit", None, "two_level"), ("2x4x1", "1gbit", "250mbit", "racks"),
              ("2x4x1", "400mbit", "100mbit", "two_level"), ("2x8x1", "400mbit", "100mbit",
                                                             "racks")]
    obs = []
    for shape, rate, uplink, path in shapes:
        for size in (4096, 1 << 20, 16 << 20, 64 << 20):
            o = {"shape": shape, "rate": rate, "uplink": uplink, "path": path, "size": size}
            o["time_s"] = overhead + m._fit_bound(o) / eff
            obs.append(o)
    return obs


def test_refit_recovers_known_parameters():
    fit = m.refit(_synthetic_observations(0.8, 250e-6))
    assert fit.link_efficiency == pytest.approx(0.8, rel=1e-9)
    assert fit.call_overhead == pytest.approx(250e-6, rel=1e-6)
    assert fit.spread < 1e-9
    # 5% noise either way shows as a +-5% spread; the overhead never goes negative
    noisy = _synthetic_observations(0.8, 100e-6)
    for i, o in enumerate(noisy):
        o["time_s"] *= 1.05 if i % 2 else 0.95
    fit = m.refit(noisy)
    assert fit.call_overhead >= 0.0
    assert 0.04 < fit.spread < 0.12 and 0.7 < fit.link_efficiency < 0.9
    with pytest.raises(ValueError, match="at least 2"):
        m.refit(noisy[:1])
    with pytest.raises(ValueError, match="positive"):
        m.refit([dict(o, time_s=0.0) for o in noisy])


def test_refit_reads_results_files_by_name(tmp_path):
    from keras_ddl_tools import results
    launch = {"meta": {"date": "2026-12-05T00:00:00Z", "commit": "f" * 40, "command": "c",
                       "machine": {"cores": 2}},
              "nodes": 8, "ranks_per_node": 1, "rate": "1gbit", "racks": 2,
              "uplink": "250mbit", "burst_bytes": 262144,
              "rows": [{"size": "64MB", "bound_us": 2.15e6, "auto_us": 2.5e6, "flat_us": 7e6,
                        "mpi_us": 5e6},
                       {"size": "256KB", "bound_us": 9e3, "auto_us": 2e4, "flat_us": 3e4,
                        "mpi_us": 2e4}]}
    merged = results.merge([launch], "racks_2x4x1_4to1", "c", "test")
    results.save(merged, str(tmp_path / "racks_2x4x1_4to1.json"))
    results.save(merged, str(tmp_path / "other_2x4x1.json"))     # not a refit name
    obs = m.observations_from_results(str(tmp_path))
    # with racks only auto (the rack allreduce) is fitted, not the two-level column
    assert [(o["shape"], o["path"], o["size"], o["time_s"]) for o in obs] == [
        ("2x4x1", "racks", 64 << 20, 2.5)]
    assert obs[0]["uplink"] == "250mbit"
    loaded, source = m.load_observations(results_dir=str(tmp_path))
    assert loaded[:len(obs)] == obs and "docs/results" in source
    # beside them, only transcribed quiet rows (3+ launches) of other shapes
    extra = loaded[len(obs):]
    assert extra and all(o["shape"] != "2x4x1" and o["launches"] >= 3 for o in extra), extra
    # named on the command line, any file name
    loaded, source = m.load_observations([str(tmp_path / "other_2x4x1.json")])
    assert [o["time_s"] for o in loaded] == [2.5] and source.endswith("other_2x4x1.json")
    # no matching file: the transcribed observations
    loaded, source = m.load_observations(results_dir=str(tmp_path / "none"))
    assert source.endswith("cluster_observations.json") and len(loaded) >= 2


ANCHORS_TEXT = """
| model | classes | batch per GPU | step (ms) | images/s | parameters | gradient bytes (fp32) |
|---|---|---|---|---|---|---|
| ResNet-50 | 1000 | 256 | 41.0 (40.7-42.0) | 6248 | 25.58 M | 102.3 MB |
| ResNet-101 | 21841 | 32 | 31.0 (27.7-38.6) | 1033 | 87.31 M | 349.2 MB |

| bytes | device->host pageable | host->device pageable | device->host pinned | host->device pinned |
|---|---|---|---|---|
| 1 MB | 0.14 ms (7.6 GB/s) | 0.12 ms (8.9 GB/s) | 0.044 ms (23.7 GB/s) | 0.043 ms (24.1 GB/s) |

| ranks | 102 MB | 349 MB |
|---|---|---|
| 8 | 45 ms | 157 ms |
"""


def test_anchors_parser_on_a_sample():
    a = m.parse_anchors(ANCHORS_TEXT)
    assert a["step_ms"] == {("resnet50", 256): 41.0, ("resnet101-22k", 32): 31.0}
    assert a["gradient_bytes"] == {"resnet50": 102.3e6, "resnet101-22k": 349.2e6}
    assert a["staging_ms"] == {1e6: (0.14, 0.12, 0.044, 0.043)}
    assert a["shm_allreduce_ms"] == {8: (45.0, 157.0)}


def test_h200_constants_match_the_measurements_file():
    """H200_ANCHORS are the figures of docs/model_data/h200.md (read from
    this checkout: an installed keras_ddl_tools has no docs/ beside it)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, m.ANCHORS_FILE)) as f:
        assert m.parse_anchors(f.read()) == m.H200_ANCHORS


def test_h200_links_from_the_anchors():
    d2h, h2d = m.h200_staging("pinned")
    # through the 1 MB and 349 MB points: both reproduced
    for link, col in ((d2h, 2), (h2d, 3)):
        for nbytes in (1e6, 349e6):
            assert link.cost(nbytes) == pytest.approx(
                m.H200_ANCHORS["staging_ms"][nbytes][col] * 1e-3, rel=0.02)
    pd2h, ph2d = m.h200_staging("pageable")
    assert ph2d.bandwidth < pd2h.bandwidth < d2h.bandwidth
    shm = m.h200_shm_link(8)
    # the 8-rank probe: 2*7/8 x 349.2 MB in 157 ms is 3.9 GB/s
    assert 3.5e9 < shm.bandwidth < 4.2e9
    # measured steps replace the MAC scaling
    setup = m.SeedSetup(seeds="h200")
    s = m.seed_system("h200_gpu", setup)
    assert s.step_compute(m.workload("resnet101-22k")) == pytest.approx(67.7e-3)
    assert s.step_compute(m.workload("resnet50")) == pytest.approx(41.0e-3)
    with pytest.raises(ValueError, match="batch 32 and 256"):
        m.seed_system("h200_gpu", m.SeedSetup(seeds="h200", batch=64))


def test_seed_predictions_hang_together():
    setup = m.SeedSetup(seeds="p100", link_efficiency=0.87, call_overhead=300e-6)
    rows = {(r["system"], r["algorithm"]): r for r in m.seeds_table(setup)}
    racks = rows[("p100_gpu", "three-level (racks)")]
    pairwise = rows[("p100_gpu", "two-level, pairwise")]
    flat = rows[("p100_gpu", "flat ring")]
    # oversubscription hurts the pairwise step most, the rack allreduce least
    assert pairwise["rel_4to1"] < pairwise["rel_1to1"] - 0.01
    assert racks["rel_1to1"] - racks["rel_4to1"] < 0.01
    assert racks["rel_4to1"] > pairwise["rel_4to1"] > flat["rel_4to1"]
    for r in rows.values():
        assert 0 < r["abs_4to1"] <= r["one_server"] <= 1


def test_cli_reference_clusters_and_docs_blocks(capsys, tmp_path):
    from keras_ddl_tools.scaling_model import add_arguments, main
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    doc = tmp_path / "d.md"
    doc.write_text("text\n<!-- model:p100 -->\nold\n<!-- /model:p100 -->\nmore\n"
                   "<!-- model:refit -->\n<!-- /model:refit -->\n")
    result = main(parser.parse_args(["--reference", "p100", "--update-doc", str(doc)]))
    out = capsys.readouterr().out
    assert "# refit on" in out and "| model | system | algorithm |" in out
    assert result["refit"]["link_efficiency"] > 0
    text = doc.read_text()
    assert "old" not in text and "| resnet50 | p100_gpu | flat ring |" in text
    assert text.startswith("text\n<!-- model:p100 -->\n") and "<!-- /model:p100 -->\nmore\n" in text
    assert f"**{result['refit']['link_efficiency']:.3f}**" in text
    # --seeds is the option's first name, still accepted
    assert parser.parse_args(["--seeds", "h200"]).seeds == "h200"
    doc.write_text("<!-- model:nonesuch -->\n<!-- /model:nonesuch -->\n")
    with pytest.raises(SystemExit, match="unknown model block 'nonesuch'"):
        main(parser.parse_args(["--update-doc", str(doc)]))
    for argv in (["--reference", "p100", "--uplink-ratio", "0"],
                 ["--reference", "h200", "--batch", "64"],
                 ["--reference", "p100", "--nodes-per-rack", "5"],
                 ["--reference", "p100", "--node-rate", "fast"]):
        with pytest.raises(SystemExit):
            main(parser.parse_args(argv))


@pytest.mark.parametrize("page", ["scaling_model.md", "scaling_model_clusters.md"])
def test_docs_model_blocks_are_the_commands_output(page):
    """Every model figure of docs/scaling_model.md and
    docs/scaling_model_clusters.md is what ``python -m
    keras_ddl_tools.scaling_model --update-doc PAGE`` writes with the default
    settings and the refit on the committed files."""
    import os
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    doc = os.path.join(repo, "docs", page)
    with open(doc) as f:
        text = f.read()
    names = set(re.findall(r"^<!-- model:([\w-]+) -->$", text, re.M))
    assert names and names <= set(m.BLOCKS), names
    obs, source = m.load_observations()
    fit = m.refit(obs, source)
    setups = {k: m.SeedSetup(seeds=k, link_efficiency=fit.link_efficiency,
                             call_overhead=fit.call_overhead) for k in m.SEED_SYSTEMS}
    assert m.render_blocks(text, setups, fit) == text, (
        f"docs/{page}: a model block differs from the model; run python -m "
        f"keras_ddl_tools.scaling_model --update-doc docs/{page}")
