"""The examples end to end on 2 ranks through ddlrun (issue 7).

Tiny JPEGs -> convert_image_folder.py -> TFRecords -> each ResNet example for
2 steps (tiny depth, width, image size and class count) backing up every
step, evaluating top-1 on a held-out split, then again with --resume at
another number of ranks (3: the global batch of 8 splits 3 + 3 + 2; and 1);
a missing held-out split is a clear error; and the quickstart.
"""

import math
import os
import re
import subprocess
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
EXAMPLES = os.path.join(os.path.dirname(TESTS_DIR), "examples")
sys.path.insert(0, TESTS_DIR)
from image_tree import write_image_tree  # noqa: E402

NUM_CLASSES = 5
TINY = ["--image-size", "32", "--num-classes", str(NUM_CLASSES), "--global-batch", "8",
        "--steps-per-epoch", "2", "--eval-images", "8", "--depth", "14",
        "--width-multiplier", "0.125"]


def ddlrun(launcher, script, args, cwd, timeout=240, nprocs=2):
    proc = launcher.ddlrun(nprocs, os.path.join(EXAMPLES, script), *args,
                           options=["--no-prefix-output"], timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, (f"{' '.join(proc.args)} exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc.stdout


@pytest.fixture(scope="module")
def records(launcher, tmp_path_factory):
    tree = tmp_path_factory.mktemp("tree")
    out = tmp_path_factory.mktemp("records")
    write_image_tree(str(tree), NUM_CLASSES, per_class=4, size=(36, 44))
    convert = [sys.executable, os.path.join(EXAMPLES, "convert_image_folder.py"),
               "--input-dir", str(tree), "--output-dir", str(out), "--num-shards", "6"]
    subprocess.run(convert, check=True, capture_output=True, env=launcher.env())
    # The held-out split the examples evaluate (the same images: a smoke test).
    subprocess.run(convert + ["--split", "validation", "--labels", str(out / "labels.txt")],
                   check=True, capture_output=True, env=launcher.env())
    # 6 shards a split: one or more for each rank at 1, 2 and 3 ranks.
    assert sorted(os.listdir(out)) == ["labels.txt"] + [
        f"{split}-{i:05d}-of-00006" for split in ("train", "validation") for i in range(6)]
    return str(out)


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def lines(stdout, tag):
    return [fields(l) for l in stdout.splitlines() if l.startswith(tag + " ")]


@pytest.mark.parametrize("script,optimizer,distribution,resume_ranks", [
    ("resnet50_imagenet1k.py", "sgd", "optimizer", 3),
    ("resnet101_imagenet22k.py", "lars", "strategy", 1),
])
def test_resnet_example_train_checkpoint_resume(launcher, script, optimizer, distribution,
                                                resume_ranks, records, tmp_path):
    ckpt = tmp_path / "ckpt"
    common = ["--data-dir", records, "--checkpoint-dir", str(ckpt), "--optimizer", optimizer,
              "--distribution", distribution, "--checkpoint-every", "1", *TINY]

    out = ddlrun(launcher, script, common + ["--epochs", "1"], cwd=str(tmp_path))
    epochs = lines(out, "EPOCH")
    assert len(epochs) == 1, out
    assert math.isfinite(float(epochs[0]["loss"])), out
    assert float(epochs[0]["images_per_s_total"]) > 0
    assert 0.0 <= float(epochs[0]["val_top1"]) <= 1.0, out   # held-out top-1, printed
    assert "eval=validation:8images" in out, out
    saved = lines(out, "CHECKPOINT")
    assert [(c["rank"], c["epoch"], c["step"]) for c in saved] == [("0", "1", "0")], out
    # A backup after step 1 (within the epoch) and at the end; nothing half-written.
    assert sorted(os.listdir(ckpt)) == ["epoch-000000-step-000000001", "epoch-000001"]

    out2 = ddlrun(launcher, script, common + ["--epochs", "2", "--resume"], cwd=str(tmp_path),
                  nprocs=resume_ranks)
    resumed = lines(out2, "RESUMED")
    assert len(resumed) == 1, out2
    assert (resumed[0]["epoch"], resumed[0]["step"], resumed[0]["iterations"],
            resumed[0]["world"]) == ("1", "0", "2", "2"), out2
    assert resumed[0]["checksum"] == saved[0]["checksum"]       # the saved weights are loaded
    assert f"ranks={resume_ranks} global_batch=8" in out2, out2
    epochs2 = lines(out2, "EPOCH")
    assert len(epochs2) == 1, out2
    assert re.search(r"^EPOCH 2/2 ", out2, re.M), out2           # continues at epoch 2
    assert math.isfinite(float(epochs2[0]["loss"]))
    assert 0.0 <= float(epochs2[0]["val_top1"]) <= 1.0, out2
    saved2 = lines(out2, "CHECKPOINT")
    assert [(c["epoch"], c["step"]) for c in saved2] == [("2", "0")], out2
    assert sorted(os.listdir(ckpt)) == ["epoch-000001-step-000000001", "epoch-000002"]


def test_a_checkpoint_dir_with_backups_needs_resume(launcher, records, tmp_path):
    import numpy as np
    from keras_ddl.keras import backup_store
    position = {"epoch": 1, "step": 0, "global_batch": 8, "iterations": 2, "world_size": 2,
                "shuffle_seed": 0, "input": "script"}
    backup_store.write_backup(str(tmp_path / "ckpt"), "epoch-000001",
                              {"position": position, "root_rank": 0},
                              [("w", np.zeros(3, np.float32))], {0: b""})
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "resnet50_imagenet1k.py"),
                           "--data-dir", records, "--checkpoint-dir", str(tmp_path / "ckpt"),
                           *TINY], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=launcher.env())
    assert proc.returncode != 0
    assert re.search(r"--checkpoint-dir \S+ holds a backup \(epoch 1, step 0\): pass --resume",
                     proc.stderr), proc.stderr[-2000:]


def test_missing_eval_split_is_named(launcher, records, tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "resnet50_imagenet1k.py"),
                           "--data-dir", records, "--eval-split", "heldout", *TINY],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=launcher.env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--eval-split heldout: no heldout-* files" in proc.stderr


def test_quickstart(launcher, tmp_path):
    out = ddlrun(launcher, "quickstart.py", ["--epochs", "2", "--checkpoint", "model.keras"],
                 cwd=str(tmp_path))
    result = lines(out, "QUICKSTART")
    assert len(result) == 1, out
    assert result[0]["ranks"] == "2"
    assert 0.0 <= float(result[0]["val_accuracy"]) <= 1.0
    assert os.path.exists(tmp_path / "model.keras")
