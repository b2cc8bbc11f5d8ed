"""Fast checks of examples/large_batch_study.py's flags and tables (no training;
the module imports neither keras nor TensorFlow until it trains)."""

import importlib.util
import json
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def study():
    path = os.path.join(ROOT, "examples", "large_batch_study.py")
    spec = importlib.util.spec_from_file_location("large_batch_study", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_module_does_not_load_keras(study):
    # The point of the lazy imports: these tests stay fast.
    assert not hasattr(study, "keras")
    assert not hasattr(study, "schedules") and not hasattr(study, "LARS")


def test_lr_grid_default_and_parsing(study):
    assert study.parse_args([]).lr_grid == (0.5, 1.0, 2.0)
    assert study.parse_args(["--lr-grid", "2, 0.25,1"]).lr_grid == (0.25, 1.0, 2.0)
    assert study.parse_args(["--lr-grid", "1"]).lr_grid == (1.0,)


@pytest.mark.parametrize("bad", ["", "1,,2", "0,1", "-1", "a", "nan", "inf", "1,1"])
def test_lr_grid_rejects_bad_values(study, bad):
    with pytest.raises(SystemExit):
        study.parse_args(["--lr-grid", bad])


def test_batches_include_128x(study):
    args = study.parse_args([])
    assert max(study.MULTIPLIERS) == 128
    assert args.train_samples >= args.base_batch * 128
    with pytest.raises(SystemExit):  # 4096 does not fit in 3000 training images
        study.parse_args(["--samples", "3600"])


def point(recipe, batch, m, acc, train_loss=0.3, test_loss=None):
    return {
        "recipe": recipe, "batch": batch, "lr_multiplier": m, "peak_lr": 0.1 * m * batch / 256,
        "steps": 100, "train_loss": train_loss,
        "test_loss": 1 - acc if test_loss is None else test_loss,
        "test_accuracy": acc, "seconds": 1.0,
        "epoch_loss": [2.0, 1.0, train_loss], "epoch_accuracy": [0.2, 0.5, acc],
        "load_average": 1.0,
    }


def synthetic(study):
    """Every recipe, batch and multiplier; the accuracy encodes which point is
    meant to win each grid."""
    results = []
    batches = [32 * m for m in study.MULTIPLIERS]
    for i, b in enumerate(batches):
        for recipe in study.RECIPES:
            for m in (0.5, 1.0, 2.0):
                acc = 0.80 - 0.01 * i
                # x2 wins for sgd at batch 32 (the baseline), x0.5 for LARS
                # everywhere, x1 elsewhere.
                if recipe == "sgd" and b == 32:
                    acc = {0.5: 0.85, 1.0: 0.86, 2.0: 0.88}[m]
                elif recipe == "lars+warmup":
                    acc += {0.5: 0.05, 1.0: 0.01, 2.0: 0.0}[m]
                else:
                    acc += {0.5: 0.0, 1.0: 0.02, 2.0: 0.01}[m]
                results.append(point(recipe, b, m, acc))
    # The copied twin of sgd at the smallest batch.
    twin = next(r for r in results if r["recipe"] == "sgd+warmup" and r["batch"] == 32
                and r["lr_multiplier"] == 0.5)
    twin["same_run_as"] = "sgd"
    # A diverged point with a nan loss must never be chosen.
    nan = point("lars+warmup", 2048, 4.0, math.nan, train_loss=math.nan, test_loss=math.nan)
    results.append(nan)
    return results


def test_best_of_grid_and_baseline(study):
    results = synthetic(study)
    best = study.best_of_grid(results)
    assert len(best) == 3 * 5
    assert best[("sgd", 32)]["lr_multiplier"] == 2.0
    assert best[("sgd+warmup", 32)]["lr_multiplier"] == 1.0
    assert best[("lars+warmup", 2048)]["lr_multiplier"] == 0.5
    assert best[("lars+warmup", 4096)]["test_accuracy"] == pytest.approx(0.80 - 0.04 + 0.05)
    base = study.baseline_point(results)
    assert (base["recipe"], base["batch"], base["lr_multiplier"]) == ("sgd", 32, 2.0)
    # The baseline is the smallest batch's best sgd point even when a larger
    # batch or another recipe scores higher.
    results.append(point("sgd", 256, 1.0, 0.99))
    results.append(point("lars+warmup", 32, 1.0, 0.995))
    assert study.baseline_point(results)["test_accuracy"] == 0.88


def _table(text, title_start):
    """Rows (lists of cells) of the first table after a line starting with
    `title_start`."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(title_start))
    while not lines[i].startswith("|"):
        i += 1
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_markdown_tables(study, tmp_path):
    results = synthetic(study)
    args = study.parse_args([])
    path = tmp_path / "results.md"
    study.write_markdown(results, args, str(path), 600.0, command="python x.py",
                         conditions="2 cores", total_points=45)
    text = path.read_text()
    assert "Partial run" not in text  # 46 points >= 45
    assert "python x.py" in text and "10.0 min" in text and "2 cores" in text
    assert "88.00% (x2" in text  # the baseline line

    main = {row[0]: row[1:] for row in _table(text, "Best of each grid")}
    assert set(main) == set(study.RECIPES)
    assert main["sgd"][0] == "88.00 (x2)"
    assert main["sgd+warmup"][0] == "82.00 (x1)"
    assert main["lars+warmup"][3] == "82.00 (x0.5)"  # batch 2048: 0.77 + 0.05
    assert main["lars+warmup"][4] == "81.00 (x0.5)"

    diff = {row[0]: row[1:] for row in _table(text, "Difference of the best")}
    assert diff["sgd"][0] == "+0.00"
    assert diff["lars+warmup"][3] == "-6.00"
    assert diff["sgd+warmup"][1] == "-7.00"  # 0.79 + 0.02 - 0.88

    details = _table(text, "Every point")
    assert len(details) == len(results)  # every point, not only the best
    keys = {(r[0], int(r[1]), r[2]) for r in details}
    assert len(keys) == len(results)
    assert ("lars+warmup", 2048, "x4") in keys
    nan_row = next(r for r in details if r[2] == "x4")
    assert nan_row[5:8] == ["nan", "nan", "nan"]
    twin = next(r for r in details if r[:3] == ["sgd+warmup", "32", "x0.5"])
    assert twin[8] == "0 (same run as sgd)"
    assert sum(r[8].startswith("0 (same") for r in details) == 1
    bold = [r for r in details if r[7].startswith("**")]
    assert len(bold) == 15
    assert ("sgd", "32", "x2") in {(r[0], r[1], r[2]) for r in bold}

    # The failed point is reported as such; no batch is within 1 point of
    # the baseline except the baseline's own.
    assert "lars+warmup at 2048 x4" in text
    assert "`sgd`: within 1 point of the baseline (or above) at 32 (1x);" in text
    assert "`lars+warmup`: within 1 point of the baseline (or above) at no batch" in text

    curves = _table(text, "Training loss per epoch")
    names = [r[0] for r in curves]
    assert "lars+warmup 2048 x0.5" in names and "lars+warmup 4096 x2" in names
    assert names[-1] == "sgd 32 x2"  # the baseline, for reference


def test_partial_markdown(study, tmp_path):
    results = [r for r in synthetic(study) if r["batch"] <= 256]
    path = tmp_path / "results.md"
    study.write_markdown(results, study.parse_args([]), str(path), 60.0, total_points=45)
    text = path.read_text()
    assert f"Partial run: {len(results)} of 45 points" in text
    main = {row[0]: row[1:] for row in _table(text, "Best of each grid")}
    assert main["sgd"][2:] == ["–", "–", "–"]


def test_runs_json_is_strict_and_round_trips(study, tmp_path):
    results = synthetic(study)
    path = str(tmp_path / "runs.json")
    study.write_runs(results, {"config": {"seed": 0}}, path)
    with open(path) as f:
        text = f.read()
    assert "NaN" not in text
    saved = json.loads(text)
    assert len(saved["runs"]) == len(results)
    back = [study._from_json(r) for r in saved["runs"]]
    assert math.isnan(back[-1]["test_accuracy"])
    assert back[0]["epoch_loss"] == results[0]["epoch_loss"]


def test_resumable(study):
    args = study.parse_args([])
    config = {k: getattr(args, k) for k in study.CONFIG_KEYS}
    config["lr_grid"] = [0.5, 1.0, 2.0]
    assert study.resumable(dict(config), config)
    assert study.resumable(dict(config, lr_grid=[1.0]), config)  # grid may differ
    assert not study.resumable(dict(config, epochs=4), config)
    assert not study.resumable(dict(config, seed=1), config)
    assert not study.resumable(None, config)
