"""Does accuracy hold at large batch? SGD vs SGD+warmup vs LARS+warmup.

Trains the same small CNN for the same number of epochs at global batch B,
8B, 32B and 64B with three recipes:

  (a) sgd           SGD (momentum 0.9), linear scaling rule, no warmup
  (b) sgd+warmup    the same, with a linear warmup (Goyal et al., 2017)
  (c) lars+warmup   LARS, linear scaling, warmup, polynomial (power 2) decay
                    (You, Gitman & Ginsburg, 2017)

Both SGD recipes use Goyal et al.'s step schedule (divide by 10 at 1/3, 2/3 and
8/9 of training, i.e. epochs 30/60/80 of 90, scaled to this run's length);
the rate at batch b is `base_lr * b / 256` with Goyal's base 0.1. LARS
(trust coefficient eeta = 0.001, applied to every variable as in You et
al.'s Algorithm 1 and LARS's default; weight decay 1e-4, not applied to
biases and BatchNormalization parameters) follows the same linear rule with
base 10: a LARS step moves each layer by about `lr * eeta` of its norm, and at
initialization this model's gradients have `||g|| / ||w|| ~ 0.1` per layer
at batch 256, so SGD's 0.1 moves a layer by ~1%, as does LARS at
0.01 / eeta = 10. (A first try with 0.3 per 256, SimCLR's LARS recipe, left
LARS barely trained even at batch B: its steps were ~30x smaller than
SGD's.) Base rates, warmup length and epochs are the flags' defaults and
were not tuned per batch size or to the outcome.

Data. scikit-learn is not a dependency of this project, so instead of its
digits the study generates its own images (numpy only, seeded, ~2 s): 60,000
grayscale 16x16 images (50,000 train, 10,000 test) of ten shape classes
(disk, ring, filled square, square frame, triangle, plus, diagonal cross,
horizontal bars, vertical bars, corner) at random position, size, small
rotation and contrast, on a random intensity gradient with a random blurred
blob and pixel noise. Small rotations keep "plus" and "cross" distinct;
noise, clutter and 16x16 pixels make ring/disk/frame/square hard to tell
apart, so a small CNN learns the task well but not perfectly (about 88% test
accuracy, not 100%), which leaves room for a recipe to fall behind.

Single process. What a data-parallel run changes is the global batch: with
N processes of batch b, the gradient averaged by `ddl.DistributedOptimizer`
or `ddl.DDLStrategy` is the gradient of the global batch N*b, so one process
at the global batch follows the same optimizer trajectory. One difference
remains: here BatchNormalization normalizes over the whole global batch,
whereas N processes each normalize over their own b samples (Goyal et al.
keep 32 per worker).

Usage (26 minutes on 2 CPU cores shared with other jobs, load ~4; less when
idle):

    python examples/large_batch_study.py --out docs/large_batch

writes `results.md` (final test accuracy per recipe and batch) and
`accuracy_vs_batch.png` (needs matplotlib; skipped with a warning if it is
not installed).
"""

import argparse
import math
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

from keras_ddl import schedules  # noqa: E402
from keras_ddl.optimizers import LARS  # noqa: E402

CLASSES = "disk ring square frame triangle plus cross h_bars v_bars corner".split()
RECIPES = ("sgd", "sgd+warmup", "lars+warmup")
MULTIPLIERS = (1, 8, 32, 64)


# --------------------------------------------------------------------- data


def _signed_distance(label, u, v):
    """> 0 inside shape `label`, in the shape's own coordinates (u, v)."""
    a, b = np.abs(u), np.abs(v)
    r = np.hypot(u, v)
    square = np.maximum(a, b)
    if label == 0:  # disk
        return 0.9 - r
    if label == 1:  # ring
        return 0.22 - np.abs(r - 0.7)
    if label == 2:  # filled square
        return 0.75 - square
    if label == 3:  # square frame
        return 0.17 - np.abs(square - 0.68)
    if label == 4:  # triangle, apex up
        return np.minimum(0.6 - v, (v + 0.85 - 1.6 * a) / 1.9)
    if label == 5:  # plus
        return np.maximum(np.minimum(0.22 - a, 0.9 - b), np.minimum(0.22 - b, 0.9 - a))
    if label == 6:  # diagonal cross: a plus turned by 45 degrees
        return _signed_distance(5, (u + v) / math.sqrt(2), (u - v) / math.sqrt(2))
    if label == 7:  # two horizontal bars
        return np.minimum(0.9 - a, 0.16 - np.abs(b - 0.45))
    if label == 8:  # two vertical bars
        return np.minimum(0.9 - b, 0.16 - np.abs(a - 0.45))
    # corner (an L)
    return np.maximum(
        np.minimum(0.2 - np.abs(u + 0.6), 0.85 - b),
        np.minimum(0.2 - np.abs(v - 0.65), 0.85 - a),
    )


def make_shapes(n, size=16, noise=0.2, seed=0, chunk=10_000):
    """`n` noisy shape images (n, size, size, 1) float32 and labels int32."""
    rng = np.random.default_rng(seed)
    grid = (np.arange(size) + 0.5) / size * 2 - 1
    yy, xx = np.meshgrid(grid, grid, indexing="ij")
    images = np.empty((n, size, size, 1), np.float32)
    labels = rng.integers(0, len(CLASSES), n).astype(np.int32)
    for start in range(0, n, chunk):
        y = labels[start : start + chunk]
        m = len(y)

        def draw(low, high, *shape):
            return rng.uniform(low, high, (m,) + shape + (1, 1))

        center, scale, angle = draw(-0.25, 0.25, 2), draw(0.5, 0.85), draw(-0.35, 0.35)
        dx, dy = xx - center[:, 0], yy - center[:, 1]
        u = (dx * np.cos(angle) + dy * np.sin(angle)) / scale
        v = (-dx * np.sin(angle) + dy * np.cos(angle)) / scale
        distance = np.empty((m, size, size))
        for label in range(len(CLASSES)):
            idx = y == label
            distance[idx] = _signed_distance(label, u[idx], v[idx])
        # Anti-aliased edge about one pixel wide.
        shape = 1 / (1 + np.exp(-distance * scale * size / 1.5))
        gradient = rng.normal(0, 0.3, (m, 2, 1, 1))
        blob_at = draw(-0.9, 0.9, 2)
        blob = draw(-0.7, 0.7) * np.exp(
            -((xx - blob_at[:, 0]) ** 2 + (yy - blob_at[:, 1]) ** 2) / 0.03
        )
        images[start : start + m, ..., 0] = (
            gradient[:, 0] * xx
            + gradient[:, 1] * yy
            + draw(0.5, 1.0) * shape
            + blob
            + rng.normal(0, noise, (m, size, size))
        )
    return images, labels


# ----------------------------------------------------------- model, recipes


def make_model():
    def block(filters):
        return [
            keras.layers.Conv2D(filters, 3, padding="same", use_bias=False),
            # momentum 0.9 (not 0.99): the largest batch takes only a few
            # hundred steps, and the moving statistics must keep up with them.
            keras.layers.BatchNormalization(momentum=0.9),
            keras.layers.ReLU(),
        ]

    return keras.Sequential(
        [keras.Input((16, 16, 1))]
        + block(8)
        + [keras.layers.MaxPooling2D()]
        + block(16)
        + [keras.layers.MaxPooling2D()]
        + block(32)
        + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(len(CLASSES))],
        name="shapes_cnn",
    )


def make_optimizer(recipe, batch, steps_per_epoch, args):
    total = args.epochs * steps_per_epoch
    warmup = schedules.epochs_to_steps(args.warmup_epochs, steps_per_epoch)
    if recipe == "lars+warmup":
        peak = schedules.linear_scaling_rule(args.lars_base_lr, batch)
        lr = schedules.PolynomialDecayWithWarmup(
            peak, total_steps=total, warmup_steps=warmup, power=2.0
        )
        return LARS(lr, momentum=0.9, weight_decay=1e-4, eeta=0.001), peak
    peak = schedules.linear_scaling_rule(args.sgd_base_lr, batch)
    boundaries = schedules.epochs_to_steps(
        [args.epochs * f for f in (30 / 90, 60 / 90, 80 / 90)], steps_per_epoch
    )
    lr = schedules.StepDecayWithWarmup(
        peak,
        boundaries=boundaries,
        warmup_steps=warmup if recipe == "sgd+warmup" else 0,
        # Goyal et al. ramp up from the small-batch rate.
        warmup_initial_learning_rate=min(
            args.sgd_base_lr * args.base_batch / 256, peak
        ),
    )
    return keras.optimizers.SGD(lr, momentum=0.9), peak


def train(recipe, batch, data, args):
    (x_train, y_train), (x_test, y_test) = data
    steps_per_epoch = math.ceil(len(x_train) / batch)
    # Same initial weights and same shuffling for every run.
    keras.utils.set_random_seed(args.seed)
    model = make_model()
    optimizer, peak = make_optimizer(recipe, batch, steps_per_epoch, args)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=max(1, min(16, steps_per_epoch // 4)),
    )
    start = time.time()
    history = model.fit(
        x_train, y_train, batch_size=batch, epochs=args.epochs, verbose=0
    )
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=2000, verbose=0)
    return {
        "recipe": recipe,
        "batch": batch,
        "peak_lr": peak,
        "steps": steps_per_epoch * args.epochs,
        "train_loss": history.history["loss"][-1],
        "test_loss": loss,
        "test_accuracy": accuracy,
        "seconds": time.time() - start,
    }


# ------------------------------------------------------------------ outputs


def write_markdown(results, args, path, wall_seconds):
    batches = sorted({r["batch"] for r in results})
    by = {(r["recipe"], r["batch"]): r for r in results}
    baseline = by[("sgd", batches[0])]["test_accuracy"]

    def cell(r):
        text = f"{100 * r['test_accuracy']:.2f}"
        return text + (" (diverged)" if not math.isfinite(r["train_loss"]) else "")

    lines = [
        "# Large-batch study: final test accuracy (%)",
        "",
        f"Generated by `examples/large_batch_study.py` ({args.epochs} epochs, "
        f"{args.train_samples} training / {args.test_samples} test images, "
        f"{args.warmup_epochs} warmup epochs, seed {args.seed}, one process; "
        f"{wall_seconds / 60:.1f} min wall time). Baseline: `sgd` at batch "
        f"{batches[0]}, {100 * baseline:.2f}%. LARS adapts every variable "
        "(its default: no `exclude_from_layer_adaptation`).",
        "",
        "| recipe | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---" * (len(batches) + 1) + "|",
    ]
    for recipe in RECIPES:
        row = [cell(by[(recipe, b)]) for b in batches]
        lines.append(f"| {recipe} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Difference to the baseline (percentage points):",
        "",
        "| recipe | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---" * (len(batches) + 1) + "|",
    ]
    for recipe in RECIPES:
        row = [
            f"{100 * (by[(recipe, b)]['test_accuracy'] - baseline):+.2f}"
            for b in batches
        ]
        lines.append(f"| {recipe} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Details (peak learning rate, optimizer steps, final training loss):",
        "",
        "| recipe | batch | peak lr | steps | train loss | test loss | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['recipe']} | {r['batch']} | {r['peak_lr']:.4g} | {r['steps']} "
            f"| {r['train_loss']:.4f} | {r['test_loss']:.4f} | {r['seconds']:.0f} |"
        )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return False
    batches = sorted({r["batch"] for r in results})
    by = {(r["recipe"], r["batch"]): r for r in results}
    fig, ax = plt.subplots(figsize=(6, 4))
    for recipe, marker in zip(RECIPES, "osD"):
        acc = [100 * by[(recipe, b)]["test_accuracy"] for b in batches]
        ax.plot(batches, acc, marker=marker, label=recipe)
    baseline = 100 * by[("sgd", batches[0])]["test_accuracy"]
    ax.axhspan(
        baseline - 1, baseline + 1, color="grey", alpha=0.2, label="baseline ±1 pt"
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch size")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("Same epochs, larger batches")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--base-batch", type=int, default=32, help="B; runs B, 8B, 32B, 64B")
    p.add_argument("--samples", type=int, default=60_000, help="train + test images")
    p.add_argument("--test-fraction", type=float, default=1 / 6)
    p.add_argument("--warmup-epochs", type=float, default=2.0)
    p.add_argument("--sgd-base-lr", type=float, default=0.1, help="per 256 images")
    p.add_argument("--lars-base-lr", type=float, default=10.0, help="per 256 images")
    p.add_argument("--noise", type=float, default=0.2, help="pixel noise of the data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="docs/large_batch", help="output directory")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.base_batch < 1:
        p.error("--epochs and --base-batch must be >= 1")
    if not 0 <= args.warmup_epochs <= args.epochs / 3:
        p.error("--warmup-epochs must be in [0, epochs / 3] (before the first decay)")
    args.test_samples = int(round(args.samples * args.test_fraction))
    args.train_samples = args.samples - args.test_samples
    if args.train_samples < args.base_batch * max(MULTIPLIERS) or args.test_samples < 1:
        p.error("--samples too small for the largest batch")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    wall = time.time()
    images, labels = make_shapes(args.samples, noise=args.noise, seed=args.seed)
    n = args.train_samples
    mean, std = images[:n].mean(), images[:n].std()
    images = (images - mean) / std
    data = (images[:n], labels[:n]), (images[n:], labels[n:])

    results = []
    for multiplier in MULTIPLIERS:
        for recipe in RECIPES:
            r = train(recipe, args.base_batch * multiplier, data, args)
            results.append(r)
            print(
                f"{recipe:>12} batch {r['batch']:>5}: test accuracy "
                f"{100 * r['test_accuracy']:6.2f}%  (lr {r['peak_lr']:.4g}, "
                f"{r['seconds']:.0f} s)",
                flush=True,
            )
    wall_seconds = time.time() - wall
    write_markdown(results, args, os.path.join(args.out, "results.md"), wall_seconds)
    write_plot(results, os.path.join(args.out, "accuracy_vs_batch.png"))
    print(f"wrote {args.out}/results.md ({wall_seconds / 60:.1f} min)")


if __name__ == "__main__":
    main()
