"""The alpha-beta scaling model (keras_ddl_tools/scaling_model.py): formulas against
hand-computed values, properties of the predictions, the published points
and the command line. Single process, no TensorFlow, a few seconds."""

import json
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
    from keras_ddl.bench.__main__ import main
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
