"""``python -m keras_ddl.bench peers`` without launching anything: its
arguments (each bad one an error naming it), the side-by-side rows built
from the two peers' rows, the printed table, the ranks' command line, and
the PERFORMANCE.md view of a results file made of such launches. The bench
itself is not part of the suite (it needs Horovod's own environment)."""

import os
import subprocess
import sys
import time

import pytest

from keras_ddl_tools import render_docs, results
from keras_ddl_tools.bench import peers
from keras_ddl_tools.bench.__main__ import parse


def test_defaults_skip_horovod_and_sweep_4kb_to_64mb():
    args = parse(["peers"])
    assert args.horovod_python is None and args.cluster is None
    assert args.ranks == 2 and args.chain == 20 and args.reps == 7
    sizes = peers.parse_sizes(args.sizes)
    assert sizes[0] == 4096 and sizes[-1] == 64 << 20
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("argv, named", [
    (["--sizes", "4096,abc"], "--sizes: 'abc'"),
    (["--sizes", "4098"], "--sizes: 4098"),
    (["--reps", "0"], "--reps"),
    (["--timeout", "0"], "--timeout"),
    (["--chain", "0"], "--chain"),
    (["-n", "1"], "--ranks"),
    (["--gradient-tensors", "0"], "--gradient-tensors"),
    (["--cluster", "2"], "--cluster '2'"),
    (["--cluster", "1x2"], "at least 2 nodes"),
    (["--horovod-python", "/nonexistent/bin/python"], "--horovod-python /nonexistent"),
])
def test_bad_arguments_are_errors_naming_them(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(["peers", *argv])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_cluster_shape():
    assert peers.cluster_shape("2x2") == (2, 2)
    assert peers.cluster_shape("3X1") == (3, 1)


def _row(method, time_us, mpi_us, wrong=0, size=4096):
    return {"method": method, "size": size, "count": size // 4, "type": "float32",
            "redop": "sum", "time_us": time_us, "algbw_GBps": size / time_us / 1e3,
            "busbw_GBps": size / time_us / 1e3, "mpi_us": mpi_us, "vs_mpi": mpi_us / time_us,
            "wrong": wrong}


def test_side_by_side_ratios_come_from_each_launch():
    ours = [_row("eager 4KB", 50.0, 10.0), _row("chain", 20.0, 5.0, wrong=1)]
    theirs = [_row("eager 4KB", 1000.0, 8.0, wrong=2), _row("chain", 10.0, 4.0)]
    table = {r["method"]: r for r in peers.side_by_side({"keras_ddl": ours, "horovod": theirs})}
    eager = table["eager 4KB"]
    assert eager["keras_ddl_speedup"] == pytest.approx(20.0)   # Horovod's time / ours
    assert eager["keras_ddl/mpi"] == pytest.approx(0.2)        # our launch's MPICH
    assert eager["horovod/mpi"] == pytest.approx(0.008)        # Horovod's launch's MPICH
    assert eager["mpi_us"] == 10.0 and eager["horovod_mpi_us"] == 8.0
    assert eager["wrong"] == 2 and table["chain"]["wrong"] == 1
    assert table["chain"]["keras_ddl_speedup"] == pytest.approx(0.5)


def test_side_by_side_without_horovod_leaves_its_cells_empty():
    table = peers.side_by_side({"keras_ddl": [_row("eager 4KB", 50.0, 10.0)]})
    assert [r["method"] for r in table] == ["eager 4KB"]
    row = table[0]
    assert row["horovod_us"] == row["horovod/mpi"] == row["keras_ddl_speedup"] == "-"
    assert row["keras_ddl_us"] == 50.0


def test_table_is_right_aligned_with_a_title_and_dashes_for_missing_cells():
    text = peers.format_table("title", ["method", "time_us", "absent"],
                              [{"method": "eager 4KB", "time_us": 1234.5678},
                               {"method": "x", "time_us": 2.0}])
    lines = text.splitlines()
    assert lines[0] == "# title"
    assert len({len(line) for line in lines[1:]}) == 1       # aligned columns
    assert lines[2].split() == ["eager", "4KB", "1234.6", "-"]
    assert lines[3].split() == ["x", "2.000", "-"]


def test_the_ranks_run_this_file_under_the_peers_python():
    args = parse(["peers", "--sizes", "4096,65536", "--reps", "3", "--chain", "5"])
    argv = peers.worker_argv("/venv/bin/python", "horovod", args, "/t/s.json", "/t/o.json")
    assert argv[0] == "/venv/bin/python"
    assert argv[1] == os.path.abspath(peers.__file__)
    options = dict(zip(argv[2::2], argv[3::2]))
    assert options == {"--worker": "horovod", "--shapes": "/t/s.json", "--out": "/t/o.json",
                       "--reps": "3", "--chain": "5", "--sizes": "4096,65536"}


def test_a_launch_uses_the_mpiexec_of_its_own_environment(tmp_path):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.touch()
    mpiexec = tmp_path / "bin" / "mpiexec"
    mpiexec.touch()
    mpiexec.chmod(0o755)
    assert peers.mpiexec_of(str(python)) == str(mpiexec)
    env = peers._venv_env(str(python), {"UCX_TLS": "tcp,self"})
    assert env["PATH"].split(os.pathsep)[0] == str(tmp_path / "bin")
    assert env["VIRTUAL_ENV"] == str(tmp_path) and env["UCX_TLS"] == "tcp,self"


def _launch(horovod_us, ours_us, mpi_us, skipped=False):
    rows = {"keras_ddl": [_row("eager 4KB", ours_us, mpi_us)]}
    info = {"keras_ddl": {"versions": {"keras_ddl": "0.1.0", "tensorflow": "2.21.0",
                                       "mpi": "MPICH Version: 5.0.2"},
                          "loadavg": ["3.5 3 2", "4.25 3 2"]}}
    if not skipped:
        rows["horovod"] = [_row("eager 4KB", horovod_us, mpi_us)]
        info["horovod"] = {"versions": {"horovod": "0.28.1", "tensorflow": "2.15.1",
                                        "horovod_controller": "mpi", "mpi": "MPICH"},
                           "loadavg": ["5.5 3 2", "2.0 3 2"]}
    return {"meta": {"date": "2026-12-07T05:00:00Z", "commit": "abc1234", "command": "c",
                     "machine": {"cores": 2}},
            "where": "one host, 2 ranks", "peers": info,
            "horovod_skipped": peers.NO_HOROVOD if skipped else None,
            **rows, "side_by_side": peers.side_by_side(rows)}


def test_the_performance_view_shows_medians_ranges_and_the_load():
    merged = results.merge([_launch(1000.0, 50.0, 10.0), _launch(900.0, 100.0, 10.0),
                            _launch(800.0, 40.0, 10.0)], "peers_1host",
                           "python -m keras_ddl.bench peers", "shared machine")
    assert results.check(merged) == []
    text = "\n".join(render_docs.view_peers(merged))
    row = next(line for line in text.splitlines() if line.startswith("| eager 4KB"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Horovod 0.9 ms (0.8-1.0); ours 0.05 (0.04-0.1); over Horovod: 20x, 9x, 20x -> 20x (9-20)
    assert cells[2] == "0.90 (0.80-1.00)"
    assert cells[4] == "0.050 (0.040-0.10)"
    assert cells[6] == "20.00x (9.00x-20.00x)"
    assert "Horovod 0.28.1 on TensorFlow 2.15.1, controller mpi" in text
    assert "load average during the launches: 2-5.5" in text
    assert "Conditions: shared machine." in text


def test_the_view_says_why_horovod_was_not_run():
    merged = results.merge([_launch(0, 50.0, 10.0, skipped=True)], "peers_1host",
                           "python -m keras_ddl.bench peers", "test")
    text = "\n".join(render_docs.view_peers(merged))
    row = next(line for line in text.splitlines() if line.startswith("| eager 4KB"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == cells[3] == cells[6] == "-"
    assert "Horovod: not run (no --horovod-python given" in text


def test_help_imports_no_tensorflow():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "keras_ddl_tools.bench",
                           "peers", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--horovod-python" in proc.stdout
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "mpi4py", "numpy")]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not yet reaped by its parent is dead too
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_launch_past_its_timeout_is_stopped_with_everything_it_started(tmp_path):
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $$ $! > {pids}; echo started >&2; wait"
    with pytest.raises(SystemExit) as exit_info:
        peers._run_bounded(["sh", "-c", script], dict(os.environ), 2, "the horovod launch")
    message = str(exit_info.value)
    assert "the horovod launch took more than --timeout 2 s" in message
    assert "started" in message                          # its last output is shown
    shell, child = (int(p) for p in pids.read_text().split())
    # a killed process takes a moment to leave (the kernel closes its files before it
    # becomes a zombie); the sleep would live on for a minute if it had not been killed
    deadline = time.monotonic() + 5
    while (_alive(shell) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(shell) and not _alive(child)       # the background sleep too


def test_a_launch_within_its_timeout_returns_its_output():
    proc = peers._run_bounded([sys.executable, "-c", "print('rows')"], dict(os.environ), 60,
                              "x")
    assert proc.returncode == 0 and proc.stdout == "rows\n"
