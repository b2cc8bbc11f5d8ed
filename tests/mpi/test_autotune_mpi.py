"""DDL_AUTOTUNE=1 under mpiexec (tests/mpi/scripts/autotune_job.py): the first
launch measures on its own allreduces and prints the algorithms per size
class when they are chosen (with what the settings' phase takes), then the
fusion thresholds and cycle times when those are; every rank's results
are numpy's sum bit for bit through the switches, every rank ends with the
table's chosen threshold and cycle time in force, and rank 0 saves the
table to DDL_AUTOTUNE_FILE; a second launch of the same shape loads it
instead of measuring; a launch of another shape refuses it with a warning
and measures again."""

import json

import os

from launching import Launcher

HEADER = "keras_ddl autotune:"
# The settings tried with the default DDL_FUSION_THRESHOLD_MB=128 and
# DDL_CYCLE_TIME_MS=1 (executor.cc, SettingCandidates), as (MB, ms).
SETTINGS = [(128, 1), (4, 1), (16, 1), (64, 1), (128, 0.5), (128, 2), (128, 5)]


def launch(launcher, ranks, mode, table_file):
    env = {"DDL_AUTOTUNE": "1", "DDL_AUTOTUNE_STEPS": "2", "DDL_AUTOTUNE_CYCLES": "1",
           "DDL_AUTOTUNE_FILE": str(table_file)}
    proc = launcher.mpi(ranks, "autotune_job.py", mode, env=env, timeout=400)
    parsed = Launcher.parse_cases(proc)
    cases = parsed.get(f"results_{mode}", {})
    failures = {r: c["detail"] for r, c in cases.items() if not c["ok"]}
    assert proc.returncode == 0 and sorted(cases) == list(range(ranks)) and not failures, (
        f"exit {proc.returncode}, reports from {sorted(cases)}, failures {failures}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    settings = parsed.get(f"settings_{mode}", {})
    assert sorted(settings) == list(range(ranks)) and all(c["ok"] for c in settings.values()), (
        settings)
    # (MB, ms) in force after each call, the same on every rank (the job
    # checks that).
    proc.in_force = [tuple(s) for s in json.loads(settings[0]["detail"])]
    return proc


def chosen_setting(lines, proc, measured_from=None):
    """The table's settings rows (one per candidate, with a score, one
    chosen). Every rank of `proc` ran, call by call: the configured setting
    until call `measured_from`, then each candidate for one call (windows
    of one cycle), twice, then the chosen one (from the first call when
    `measured_from` is None: a loaded table)."""
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("fusion threshold"))
    rows = lines[at + 1:at + 1 + len(SETTINGS)]
    shown = [(float(r.split()[0]), float(r.split()[2])) for r in rows]
    assert shown == SETTINGS and all("MiB/s" in r for r in rows), lines
    assert "(configured)" in rows[0] and len(lines) == at + 1 + len(SETTINGS), lines
    chosen = [s for s, r in zip(SETTINGS, rows) if r.rstrip().endswith("*")]
    assert len(chosen) == 1, lines
    start = 0 if measured_from is None else measured_from + 2 * len(SETTINGS)
    plan = ([] if measured_from is None else
            [SETTINGS[0]] * measured_from + SETTINGS * 2) + [chosen[0]] * (len(proc.in_force) - start)
    assert proc.in_force == plan and start < len(plan), (proc.in_force, plan, lines)
    return chosen[0]


def tables(proc, count):
    """The lines of each of the `count` tables in the launch's stderr."""
    assert proc.stderr.count(HEADER) == count, proc.stderr[-4000:]
    found = []
    for piece in proc.stderr.split(HEADER)[1:]:
        lines = (HEADER + piece).splitlines()
        end = next((i for i, line in enumerate(lines[1:], 1) if not line.startswith("  ")),
                   len(lines))
        found.append(lines[:end])
    return found


def table(proc):
    """A measuring launch's table: the algorithms' part, printed when they
    were chosen and ending with what the settings' phase takes, then the
    settings' part, printed at its end; as one list of lines (the
    algorithms' heading first) to compare with a loaded table."""
    algorithms, settings = tables(proc, 2)
    assert algorithms[-1] == (f"  next: {len(SETTINGS)} fusion thresholds and cycle times, 2 "
                              f"windows of 1 cycle each: the next {2 * len(SETTINGS)} cycles "
                              "that run allreduces"), algorithms
    assert "fusion threshold and cycle time" in settings[0], settings
    assert "measured 2 windows of 1 cycle per setting" in settings[0], settings
    return algorithms[:-1] + settings[1:]


def loaded_table(proc):
    """A loading launch's one table."""
    return tables(proc, 1)[0]


def check_measured(launched, table_file, ranks, step, candidates):
    """A measuring launch's table and saved file; returns (table, chosen
    setting, the saved file's mtime)."""
    first = table(launched)
    assert f"the {step} step's allreduce (ranks={ranks} " in first[0], first
    assert "measured 2 batches per candidate" in first[0], first
    # Both size classes the job used were measured, with every candidate,
    # and each has exactly one choice.
    for size_class in ("< 64 KiB", "64 KiB - 1 MiB"):
        at = next(i for i, line in enumerate(first) if line.strip().startswith(size_class))
        rows = first[at:at + len(candidates)]
        assert all(c in r and " ms" in r for c, r in zip(candidates, rows)), first
        assert sum(r.rstrip().endswith("*") for r in rows) == 1, first
    # The algorithms first: 2 size classes x the candidates x 2 batches.
    chosen = chosen_setting(first, launched, measured_from=2 * 2 * len(candidates))
    saved = table_file.read_text()
    assert saved.startswith("keras_ddl autotune table v2\n") and f"step={step}" in saved
    assert f"\nsettings_chosen {SETTINGS.index(chosen)} " in saved, saved
    assert f"ranks={ranks} " in saved, saved
    assert not [p for p in os.listdir(table_file.parent) if ".tmp." in p], \
        os.listdir(table_file.parent)
    return first, chosen, table_file.stat().st_mtime_ns


def check_loaded(again, table_file, first, chosen, mtime):
    """The same shape launched again: loaded, not measured, not rewritten."""
    second = loaded_table(again)
    assert f"loaded from {table_file}, not measured again" in second[0], second
    assert second[1:] == first[1:], (first, second)
    assert chosen_setting(second, again) == chosen
    assert table_file.stat().st_mtime_ns == mtime


WORLD_CANDIDATES = ["DIRECT_EXCHANGE_ALLREDUCE", "PAIRWISE_RING_ALLREDUCE"]
# 3 ranks as 3 nodes, no topology given: the chain is a candidate too (with
# 2 it would send what the pairwise ring sends).
WORLD_3_CANDIDATES = WORLD_CANDIDATES + ["CHAIN_ALLREDUCE"]


def test_another_shape_is_refused_measured_again_then_reused(launcher, tmp_path):
    """2 ranks measure and save; 3 ranks refuse that table, measure and save
    their own; 3 ranks again load it. (One launch fewer than measuring 3
    ranks from nothing in a test of their own.)"""
    table_file = tmp_path / "autotune.txt"
    check_measured(launch(launcher, 2, "world", table_file), table_file, 2, "world",
                   WORLD_CANDIDATES)
    proc = launch(launcher, 3, "world", table_file)
    assert (f"warning: not using DDL_AUTOTUNE_FILE={table_file}: it was measured for another "
            "job shape (ranks=2 ") in proc.stderr, proc.stderr[-3000:]
    first, chosen, mtime = check_measured(proc, table_file, 3, "world", WORLD_3_CANDIDATES)
    check_loaded(launch(launcher, 3, "world", table_file), table_file, first, chosen, mtime)


def test_racks_measured_once_saved_and_reused(launcher, tmp_path):
    """4 ranks in 2 racks; DDL_UPLINK_COMPRESSION=auto (set by the job)
    adds the fp16-uplink candidate."""
    candidates = ["RACK_ORDERED_EXCHANGE", "RACK_ALLREDUCE_256K", "RACK_ALLREDUCE_1M",
                  "RACK_ALLREDUCE_SIZED", "RACK_ALLREDUCE_SIZED_FP16UP"]
    table_file = tmp_path / "autotune.txt"
    first, chosen, mtime = check_measured(launch(launcher, 4, "racks", table_file), table_file,
                                          4, "racks", candidates)
    check_loaded(launch(launcher, 4, "racks", table_file), table_file, first, chosen, mtime)


def test_cross_node_step_measured_with_the_node_single_pass(launcher, tmp_path):
    """4 ranks as 2 virtual nodes of 2: the cross-node step's candidates,
    the node's single pass among them, each measured in both size classes,
    every result in node-then-cross order bit for bit through the
    switches."""
    table_file = tmp_path / "autotune.txt"
    check_measured(launch(launcher, 4, "cross", table_file), table_file, 4, "cross-node",
                   ["DIRECT_EXCHANGE_ALLREDUCE", "PAIRWISE_RING_ALLREDUCE",
                    "NODE_LEADER_EXCHANGE"])
