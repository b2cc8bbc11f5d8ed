"""Does accuracy hold at large batch? SGD vs SGD+warmup vs LARS+warmup.

Trains the same small CNN for the same number of epochs at global batch B,
8B, 32B, 64B and 128B with three recipes:

  (a) sgd           SGD (momentum 0.9), linear scaling rule, no warmup
  (b) sgd+warmup    the same, with a linear warmup (Goyal et al., 2017)
  (c) lars+warmup   LARS, linear scaling, warmup, polynomial (power 2) decay
                    (You, Gitman & Ginsburg, 2017)

Every recipe runs at every batch with a small grid of peak learning rates
around its scaling rule, `--lr-grid` (default 0.5,1,2): multiplier m gives the
peak rate `m * base_lr * b / 256`. Same seed (initial weights, shuffling),
same epochs and same data for every point. The main table reports the best
point of each grid (by final test accuracy); the details table lists every
point, and `runs.json` holds the per-epoch training curves of every point.

Both SGD recipes use Goyal et al.'s step schedule (divide by 10 at 1/3, 2/3 and
8/9 of training, i.e. epochs 30/60/80 of 90, scaled to this run's length);
the rate at batch b is `m * base_lr * b / 256` with Goyal's base 0.1, and the
warmup of (b) ramps from the same grid point's rate at batch B,
`m * base_lr * B / 256` (Goyal et al. ramp up from the small-batch rate; at
batch B itself the warmup is therefore constant and (b) is the same run as
(a)). LARS (trust coefficient eeta = 0.001, applied to every variable as in
You et al.'s Algorithm 1 and LARS's default; weight decay 1e-4, not applied
to biases and BatchNormalization parameters) follows the same linear rule
with base 10: a LARS step moves each layer by about `lr * eeta` of its norm,
and at initialization this model's gradients have `||g|| / ||w|| ~ 0.1` per
layer at batch 256, so SGD's 0.1 moves a layer by ~1%, as does LARS at
0.01 / eeta = 10. (A first try with 0.3 per 256, SimCLR's LARS recipe, left
LARS barely trained even at batch B: its steps were ~30x smaller than
SGD's.) Base rates, the grid, warmup length and epochs are the flags'
defaults and were not tuned per batch size or to the outcome.

Data. scikit-learn is not a dependency of this project, so instead of its
digits the study generates its own images (numpy only, seeded, ~2 s): 60,000
grayscale 16x16 images (50,000 train, 10,000 test) of ten shape classes
(disk, ring, filled square, square frame, triangle, plus, diagonal cross,
horizontal bars, vertical bars, corner) at random position, size, small
rotation and contrast, on a random intensity gradient with a random blurred
blob and pixel noise. Small rotations keep "plus" and "cross" distinct;
noise, clutter and 16x16 pixels make ring/disk/frame/square hard to tell
apart, so a small CNN learns the task well but not perfectly (about 88% test
accuracy, not 100%), which leaves room for a recipe to fall behind. At batch
4096 (128x) an epoch is only 13 steps, 104 in 8 epochs.

Single process. What a data-parallel run changes is the global batch: with
N processes of batch b, the gradient averaged by `ddl.DistributedOptimizer`
or `ddl.DDLStrategy` is the gradient of the global batch N*b, so one process
at the global batch follows the same optimizer trajectory. One difference
remains: here BatchNormalization normalizes over the whole global batch,
whereas N processes each normalize over their own b samples (Goyal et al.
keep 32 per worker).

Usage (45 points; see docs/large_batch/results.md for the measured wall time):

    nice -n 10 python examples/large_batch_study.py --out docs/large_batch

(without --out, a new directory large_batch_study-YYYYMMDD-HHMMSS is made in the
current directory, so the committed results are never overwritten by accident)

It writes, after every point (so a stopped run keeps what it finished;
`--resume` continues it), `runs.json` (every point with its per-epoch loss
and accuracy), `results.md` (best-of-grid and per-point tables, LARS's
per-epoch loss at the largest batches), `accuracy_vs_batch.png` and
`lars_curves.png` (the plots need matplotlib; skipped with a warning if it is
not installed).
"""

import argparse
import json
import math
import os
import shlex
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# keras and keras_ddl are imported where they are used, so that the table and
# argument code can be imported (and tested) without loading TensorFlow.

CLASSES = "disk ring square frame triangle plus cross h_bars v_bars corner".split()
RECIPES = ("sgd", "sgd+warmup", "lars+warmup")
MULTIPLIERS = (1, 8, 32, 64, 128)
DEFAULT_LR_GRID = "0.5,1,2"
# Per-epoch LARS curves are tabulated in results.md at these batch multipliers.
CURVE_MULTIPLIERS = (64, 128)
# A final training loss at or above chance (ln 10 for ten classes) means the
# run did not train, or diverged.
CHANCE_LOSS = math.log(len(CLASSES))
# Settings that must match for --resume to reuse points of an earlier run.
CONFIG_KEYS = (
    "epochs", "base_batch", "samples", "test_fraction", "warmup_epochs",
    "sgd_base_lr", "lars_base_lr", "noise", "seed",
)


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
    import keras

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


def make_optimizer(recipe, batch, steps_per_epoch, args, lr_multiplier=1.0):
    """(optimizer, peak learning rate) of `recipe` at `batch`; the peak is
    `lr_multiplier` times the linear scaling rule's rate."""
    import keras

    from keras_ddl import schedules
    from keras_ddl.optimizers import LARS

    total = args.epochs * steps_per_epoch
    warmup = schedules.epochs_to_steps(args.warmup_epochs, steps_per_epoch)
    if recipe == "lars+warmup":
        peak = lr_multiplier * schedules.linear_scaling_rule(args.lars_base_lr, batch)
        lr = schedules.PolynomialDecayWithWarmup(
            peak, total_steps=total, warmup_steps=warmup, power=2.0
        )
        return LARS(lr, momentum=0.9, weight_decay=1e-4, eeta=0.001), peak
    peak = lr_multiplier * schedules.linear_scaling_rule(args.sgd_base_lr, batch)
    boundaries = schedules.epochs_to_steps(
        [args.epochs * f for f in (30 / 90, 60 / 90, 80 / 90)], steps_per_epoch
    )
    lr = schedules.StepDecayWithWarmup(
        peak,
        boundaries=boundaries,
        warmup_steps=warmup if recipe == "sgd+warmup" else 0,
        # Goyal et al. ramp up from the small-batch rate (of the same grid
        # point).
        warmup_initial_learning_rate=min(
            lr_multiplier * schedules.linear_scaling_rule(args.sgd_base_lr, args.base_batch),
            peak,
        ),
    )
    return keras.optimizers.SGD(lr, momentum=0.9), peak


def train(recipe, batch, lr_multiplier, data, args):
    import keras

    (x_train, y_train), (x_test, y_test) = data
    steps_per_epoch = math.ceil(len(x_train) / batch)
    # Same initial weights and same shuffling for every run.
    keras.utils.set_random_seed(args.seed)
    model = make_model()
    optimizer, peak = make_optimizer(recipe, batch, steps_per_epoch, args, lr_multiplier)
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
        "lr_multiplier": lr_multiplier,
        "peak_lr": peak,
        "steps": steps_per_epoch * args.epochs,
        "train_loss": float(history.history["loss"][-1]),
        "test_loss": float(loss),
        "test_accuracy": float(accuracy),
        "seconds": time.time() - start,
        "epoch_loss": [float(v) for v in history.history["loss"]],
        "epoch_accuracy": [float(v) for v in history.history["accuracy"]],
        "load_average": os.getloadavg()[0],
    }


# ------------------------------------------------------------------ outputs


def _accuracy_key(r):
    """Sort key of a grid point: higher test accuracy first, a non-finite
    accuracy last; ties go to the lower test loss."""
    acc = r["test_accuracy"]
    loss = r["test_loss"]
    return (
        acc if acc is not None and math.isfinite(acc) else -math.inf,
        -loss if loss is not None and math.isfinite(loss) else -math.inf,
    )


def best_of_grid(results):
    """{(recipe, batch): the point of that grid with the best test accuracy}."""
    best = {}
    for r in results:
        key = (r["recipe"], r["batch"])
        if key not in best or _accuracy_key(r) > _accuracy_key(best[key]):
            best[key] = r
    return best


def baseline_point(results):
    """The best `sgd` grid point at the smallest batch, or None."""
    sgd = [r for r in results if r["recipe"] == "sgd"]
    if not sgd:
        return None
    smallest = min(r["batch"] for r in sgd)
    return best_of_grid([r for r in sgd if r["batch"] == smallest])[("sgd", smallest)]


def failed(r):
    loss = r["train_loss"]
    return loss is None or not math.isfinite(loss) or loss >= CHANCE_LOSS


def _num(value, fmt):
    if value is None or not math.isfinite(value):
        return "nan"
    return format(value, fmt)


def _mult(m):
    return f"x{m:g}"


def write_markdown(
    results, args, path, wall_seconds, command=None, conditions=None, total_points=None
):
    """Writes the study's tables to `path`. `results` may be a partial run."""
    batches = [args.base_batch * m for m in MULTIPLIERS]
    best = best_of_grid(results)
    base = baseline_point(results)
    grid = sorted({r["lr_multiplier"] for r in results})
    header = "| recipe | " + " | ".join(f"batch {b}" for b in batches) + " |"
    rule = "|---" * (len(batches) + 1) + "|"

    def cell(recipe, b):
        r = best.get((recipe, b))
        if r is None:
            return "–"
        text = f"{_num(100 * r['test_accuracy'], '.2f')} ({_mult(r['lr_multiplier'])})"
        return text + (" (failed)" if failed(r) else "")

    lines = ["# Large-batch study: final test accuracy (%)", ""]
    if total_points is not None and len(results) < total_points:
        lines += [
            f"> **Partial run: {len(results)} of {total_points} points.** "
            "The tables below are rewritten as each point finishes.",
            "",
        ]
    lines += [
        f"Generated by `examples/large_batch_study.py`: {args.epochs} epochs, "
        f"{args.train_samples} training / {args.test_samples} test images "
        f"(`--samples {args.samples}`), {args.warmup_epochs:g} warmup epochs, "
        f"seed {args.seed} for every point, one process. Peak learning rate "
        f"= multiplier x linear scaling rule (`{args.sgd_base_lr:g}` per 256 "
        f"images for SGD, `{args.lars_base_lr:g}` for LARS), multipliers "
        f"{', '.join(_mult(m) for m in grid)}. LARS adapts every variable "
        "(its default: no `exclude_from_layer_adaptation`).",
        "",
    ]
    if command:
        lines += ["Reproduce with (one command):", "", "```bash", command, "```", ""]
    lines += [
        f"Wall time: {wall_seconds / 60:.1f} min for {len(results)} points"
        + (f" ({conditions})" if conditions else "")
        + ".",
        "",
    ]
    if base is not None:
        lines += [
            f"Baseline: the best `sgd` grid point at batch {base['batch']}, "
            f"{_num(100 * base['test_accuracy'], '.2f')}% "
            f"({_mult(base['lr_multiplier'])}, peak lr {base['peak_lr']:.4g}).",
            "",
        ]
    lines += [
        "Best of each grid (test accuracy %, with the multiplier that gave it). "
        "The grid is selected on the same test images it is reported on, for "
        "every cell alike, the baseline included.",
        "",
        header,
        rule,
    ]
    for recipe in RECIPES:
        lines.append(f"| {recipe} | " + " | ".join(cell(recipe, b) for b in batches) + " |")
    if base is not None:
        lines += [
            "",
            "Difference of the best of each grid to the baseline (percentage points):",
            "",
            header,
            rule,
        ]
        for recipe in RECIPES:
            row = []
            for b in batches:
                r = best.get((recipe, b))
                row.append(
                    "–" if r is None
                    else _num(100 * (r["test_accuracy"] - base["test_accuracy"]), "+.2f")
                )
            lines.append(f"| {recipe} | " + " | ".join(row) + " |")
        lines += ["", "Summary (computed from the tables above):", ""]
        for recipe in RECIPES:
            within = [
                b for b in batches
                if (recipe, b) in best
                and best[(recipe, b)]["test_accuracy"] - base["test_accuracy"] >= -0.01
            ]
            done = [b for b in batches if (recipe, b) in best]
            if not done:
                continue
            lines.append(
                f"- `{recipe}`: within 1 point of the baseline (or above) at "
                + (", ".join(f"{b} ({b // args.base_batch}x)" for b in within) or "no batch")
                + f"; measured at {len(done)} of {len(batches)} batches."
            )
        if len(grid) > 1:
            edge = [
                f"{recipe} at {b} ({_mult(best[(recipe, b)]['lr_multiplier'])})"
                for recipe in RECIPES for b in batches
                if (recipe, b) in best
                and best[(recipe, b)]["lr_multiplier"] in (grid[0], grid[-1])
            ]
            lines.append(
                "- Best point at an edge of the grid (the best rate may lie "
                "outside it): " + ("; ".join(edge) if edge else "none") + "."
            )
        bad = [r for r in results if failed(r)]
        lines.append(
            f"- Points that did not train (final training loss not finite or "
            f">= ln 10 = {CHANCE_LOSS:.3f}, chance): "
            + ("; ".join(
                f"{r['recipe']} at {r['batch']} {_mult(r['lr_multiplier'])}" for r in bad
            ) or "none")
            + "."
        )
    lines += [
        "",
        "Every point (the best of each grid in bold). At the smallest batch, "
        "`sgd+warmup`'s warmup ramps from the grid point's rate to itself, so "
        "it is the same run as `sgd` and is copied from it, not trained twice.",
        "",
        "| recipe | batch | lr multiplier | peak lr | steps | train loss | test loss "
        "| test acc (%) | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    chosen = {id(r) for r in best.values()}
    order = {recipe: i for i, recipe in enumerate(RECIPES)}
    for r in sorted(
        results, key=lambda r: (r["batch"], order.get(r["recipe"], 99), r["lr_multiplier"])
    ):
        acc = _num(100 * r["test_accuracy"], ".2f")
        if id(r) in chosen:
            acc = f"**{acc}**"
        lines.append(
            f"| {r['recipe']} | {r['batch']} | {_mult(r['lr_multiplier'])} "
            f"| {r['peak_lr']:.4g} | {r['steps']} | {_num(r['train_loss'], '.4f')} "
            f"| {_num(r['test_loss'], '.4f')} | {acc} | "
            + (f"0 (same run as {r['same_run_as']})" if r.get("same_run_as")
               else f"{r['seconds']:.0f}")
            + " |"
        )
    curve_batches = [args.base_batch * m for m in CURVE_MULTIPLIERS]
    curves = [
        r for r in results
        if r["recipe"] == "lars+warmup" and r["batch"] in curve_batches and r.get("epoch_loss")
    ]
    if curves:
        curves.sort(key=lambda r: (r["batch"], r["lr_multiplier"]))
        if base is not None and base.get("epoch_loss"):
            curves.append(base)
        epochs = max(len(r["epoch_loss"]) for r in curves)
        lines += [
            "",
            f"Training loss per epoch, `lars+warmup` at "
            f"{' and '.join(str(b) for b in curve_batches)} (every grid point; "
            "the baseline last for reference; every LARS point in "
            "`lars_curves.png`, every point's curves in `runs.json`):",
            "",
            "| run | " + " | ".join(f"ep {e + 1}" for e in range(epochs)) + " |",
            "|---" * (epochs + 1) + "|",
        ]
        for r in curves:
            name = f"{r['recipe']} {r['batch']} {_mult(r['lr_multiplier'])}"
            values = [_num(v, ".3f") for v in r["epoch_loss"]]
            values += [""] * (epochs - len(values))
            lines.append(f"| {name} | " + " | ".join(values) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return None
    return plt


def write_plot(results, path):
    """Best-of-grid accuracy per recipe vs batch, with the baseline +-1 pt band."""
    plt = _pyplot()
    if plt is None:
        return False
    best = best_of_grid(results)
    batches = sorted({r["batch"] for r in results})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for recipe, marker in zip(RECIPES, "osD"):
        points = [(b, best[(recipe, b)]) for b in batches if (recipe, b) in best]
        if not points:
            continue
        xs = [b for b, _ in points]
        acc = [100 * r["test_accuracy"] for _, r in points]
        ax.plot(xs, acc, marker=marker, label=recipe)
        for x, y, (_, r) in zip(xs, acc, points):
            ax.annotate(
                _mult(r["lr_multiplier"]), (x, y), textcoords="offset points",
                xytext=(4, -10 if recipe == "lars+warmup" else 4), fontsize=7,
            )
    base = baseline_point(results)
    if base is not None:
        b = 100 * base["test_accuracy"]
        ax.axhspan(b - 1, b + 1, color="grey", alpha=0.2, label="baseline ±1 pt")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch size")
    ax.set_ylabel("final test accuracy (%), best of the lr grid")
    ax.set_title("Same epochs, larger batches (best of each lr grid)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_lars_curves(results, path):
    """Per-epoch training loss of every lars+warmup point, one panel per batch."""
    plt = _pyplot()
    if plt is None:
        return False
    lars = [r for r in results if r["recipe"] == "lars+warmup" and r.get("epoch_loss")]
    if not lars:
        return False
    batches = sorted({r["batch"] for r in lars})
    base = baseline_point(results)
    fig, axes = plt.subplots(
        1, len(batches), figsize=(2.6 * len(batches), 3.0), sharey=True, squeeze=False
    )
    for ax, b in zip(axes[0], batches):
        for r in sorted((r for r in lars if r["batch"] == b), key=lambda r: r["lr_multiplier"]):
            loss = [v if v is not None else math.nan for v in r["epoch_loss"]]
            ax.plot(range(1, len(loss) + 1), loss, marker=".",
                    label=f"{_mult(r['lr_multiplier'])} (lr {r['peak_lr']:.3g})")
        if base is not None and base.get("epoch_loss"):
            ax.plot(range(1, len(base["epoch_loss"]) + 1), base["epoch_loss"],
                    color="grey", linestyle="--", label="baseline")
        ax.axhline(CHANCE_LOSS, color="red", linewidth=0.8, linestyle=":")
        ax.set_title(f"LARS, batch {b}", fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("training loss (red: chance)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _from_json(r):
    """A point read back from runs.json: null numbers back to nan."""
    r = dict(r)
    for key in ("train_loss", "test_loss", "test_accuracy"):
        if r.get(key) is None:
            r[key] = math.nan
    for key in ("epoch_loss", "epoch_accuracy"):
        r[key] = [math.nan if v is None else v for v in r.get(key, [])]
    return r


def write_runs(results, meta, path):
    """Writes runs.json atomically (strict JSON: a non-finite number is null)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_json_safe({"meta": meta, "runs": results}), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def parse_lr_grid(text):
    """'0.5,1,2' -> (0.5, 1.0, 2.0); raises ValueError on a bad grid."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty entry in {text!r}")
        value = float(part)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"multipliers must be finite and > 0, got {part!r}")
        if value in values:
            raise ValueError(f"{part!r} appears twice in {text!r}")
        values.append(value)
    return tuple(sorted(values))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8, help="epochs of every point")
    p.add_argument(
        "--base-batch", type=int, default=32, help="B; runs B, 8B, 32B, 64B, 128B"
    )
    p.add_argument("--samples", type=int, default=60_000, help="train + test images")
    p.add_argument("--test-fraction", type=float, default=1 / 6,
                   help="share of --samples held out for the test accuracy")
    p.add_argument("--warmup-epochs", type=float, default=2.0,
                   help="linear warmup of the warmup recipes, in epochs")
    p.add_argument("--sgd-base-lr", type=float, default=0.1, help="per 256 images")
    p.add_argument("--lars-base-lr", type=float, default=10.0, help="per 256 images")
    p.add_argument(
        "--lr-grid", default=DEFAULT_LR_GRID,
        help="comma-separated multipliers of each recipe's linear-scaling-rule "
        f"peak rate, every one run at every batch (default {DEFAULT_LR_GRID})",
    )
    p.add_argument("--noise", type=float, default=0.2, help="pixel noise of the data")
    p.add_argument("--seed", type=int, default=0, help="data, initial weights, shuffling")
    p.add_argument("--out", help="output directory (default: a new directory "
                   "large_batch_study-YYYYMMDD-HHMMSS here, so no earlier results, such as "
                   "the committed docs/large_batch, are overwritten)")
    p.add_argument(
        "--resume", action="store_true",
        help="reuse the points of OUT/runs.json written with the same settings "
        "(the lr grid may differ: points of multipliers in --lr-grid are reused)",
    )
    args = p.parse_args(argv)
    if args.out is None:
        if args.resume:
            p.error("--resume needs --out DIR, the directory of the run to continue")
        args.out = time.strftime("large_batch_study-%Y%m%d-%H%M%S")
    try:
        args.lr_grid = parse_lr_grid(args.lr_grid)
    except ValueError as e:
        p.error(f"--lr-grid: {e}")
    if args.epochs < 1 or args.base_batch < 1:
        p.error("--epochs and --base-batch must be >= 1")
    if not 0 <= args.warmup_epochs <= args.epochs / 3:
        p.error("--warmup-epochs must be in [0, epochs / 3] (before the first decay)")
    args.test_samples = int(round(args.samples * args.test_fraction))
    args.train_samples = args.samples - args.test_samples
    if args.train_samples < args.base_batch * max(MULTIPLIERS) or args.test_samples < 1:
        p.error("--samples too small for the largest batch")
    return args


def resumable(saved, config):
    """Whether points saved with settings `saved` can be reused under
    `config`: every setting equal except the lr grid (a point is reused when
    its multiplier is in the new grid)."""
    if not saved:
        return False
    strip = lambda c: {k: v for k, v in c.items() if k != "lr_grid"}  # noqa: E731
    return strip(saved) == strip(config)


def _conditions(results, start_load):
    loads = [start_load] + [r["load_average"] for r in results if r.get("load_average") is not None]
    nice = os.nice(0)
    return (
        f"{os.cpu_count()} CPU cores shared with other jobs, "
        + (f"process niceness {nice}, " if nice else "not nice'd, ")
        + f"1-min load average {min(loads):.1f}-{max(loads):.1f} "
        "(sampled at the start and after each point)"
    )


def launched_ranks(environ=os.environ):
    """How many processes an MPI launcher started with this one (1 alone)."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if launched_ranks() > 1:
        # N copies would train the same points and write the same files.
        sys.exit(f"large_batch_study.py runs on one process (it trains at the global batch "
                 f"itself); it was launched as {launched_ranks()} ranks: run it with python")
    os.makedirs(args.out, exist_ok=True)
    runs_path = os.path.join(args.out, "runs.json")
    # The command that reproduces the results from scratch: without --resume.
    command = shlex.join(
        ["python", "examples/large_batch_study.py"] + [a for a in argv if a != "--resume"]
    )
    nice = os.nice(0)
    if nice:
        command = f"nice -n {nice} " + command
    config = {k: getattr(args, k) for k in CONFIG_KEYS}
    config["lr_grid"] = list(args.lr_grid)

    results, previous_wall, start_load = [], 0.0, os.getloadavg()[0]
    if args.resume and os.path.exists(runs_path):
        with open(runs_path) as f:
            saved = json.load(f)
        if not resumable(saved["meta"].get("config"), config):
            sys.exit(f"--resume: {runs_path} was written with other settings: "
                     f"{saved['meta'].get('config')}")
        results = [
            _from_json(r) for r in saved["runs"] if r["lr_multiplier"] in args.lr_grid
        ]
        previous_wall = saved["meta"].get("wall_seconds", 0.0)
        start_load = saved["meta"].get("start_load_average", start_load)
        print(f"resuming: {len(results)} points from {runs_path}", flush=True)

    wall = time.time()
    images, labels = make_shapes(args.samples, noise=args.noise, seed=args.seed)
    n = args.train_samples
    mean, std = images[:n].mean(), images[:n].std()
    images = (images - mean) / std
    data = (images[:n], labels[:n]), (images[n:], labels[n:])

    plan = [
        (recipe, args.base_batch * multiplier, lr_multiplier)
        for multiplier in MULTIPLIERS
        for recipe in RECIPES
        for lr_multiplier in args.lr_grid
    ]
    done = {(r["recipe"], r["batch"], r["lr_multiplier"]) for r in results}

    def write_all():
        wall_seconds = previous_wall + time.time() - wall
        meta = {
            "command": command,
            "config": config,
            "wall_seconds": wall_seconds,
            "complete": len(results) >= len(plan),
            "start_load_average": start_load,
            "conditions": _conditions(results, start_load),
        }
        write_runs(results, meta, runs_path)
        write_markdown(
            results, args, os.path.join(args.out, "results.md"), wall_seconds,
            command=command,
            conditions=meta["conditions"] + (
                "; resumed, the wall time is the sum over the runs" if previous_wall else ""
            ),
            total_points=len(plan),
        )
        write_plot(results, os.path.join(args.out, "accuracy_vs_batch.png"))
        write_lars_curves(results, os.path.join(args.out, "lars_curves.png"))
        return wall_seconds

    for i, (recipe, batch, lr_multiplier) in enumerate(plan):
        if (recipe, batch, lr_multiplier) in done:
            continue
        twin = next(
            (
                r for r in results
                if (r["recipe"], r["batch"], r["lr_multiplier"]) == ("sgd", batch, lr_multiplier)
            ),
            None,
        )
        if recipe == "sgd+warmup" and batch == args.base_batch and twin is not None:
            # At batch B the warmup ramps from the grid point's batch-B rate
            # to itself: a constant rate, the same run as sgd (same seed),
            # so it is copied rather than trained twice.
            r = dict(twin, recipe=recipe, seconds=0.0, same_run_as="sgd",
                     load_average=os.getloadavg()[0])
        else:
            r = train(recipe, batch, lr_multiplier, data, args)
        results.append(r)
        wall_seconds = write_all()
        print(
            f"[{i + 1}/{len(plan)} {wall_seconds / 60:5.1f} min] {recipe:>12} batch "
            f"{batch:>5} {_mult(lr_multiplier):>5}: test accuracy "
            f"{100 * r['test_accuracy']:6.2f}%  (lr {r['peak_lr']:.4g}, train loss "
            f"{r['train_loss']:.4f}, {r['seconds']:.0f} s, load {r['load_average']:.1f})",
            flush=True,
        )
    wall_seconds = write_all()
    print(f"wrote {args.out}/results.md ({wall_seconds / 60:.1f} min)")


if __name__ == "__main__":
    main()
