"""Keras ``model.fit`` step time: DDLStrategy against plain Keras, and weak scaling.

    taskset -c 0 python -m keras_ddl.bench fit            # (1) one process
    python -m keras_ddl.bench fit --scaling 2             # (2) 1 vs 2 ranks, one core each
    mpiexec -n 2 -bind-to core python -m keras_ddl.bench fit   # (3) one N-rank measurement

The model is a small compute-bound CNN (four 3x3 convolutions on 32x32x3
synthetic images, ~66k parameters, SGD, accuracy metric), or with
``--model resnet50`` Keras' ResNet-50 (25.6 M parameters, 1000 classes,
``--image-size``, default 224); TensorFlow runs
one intra-op and one inter-op thread per process (``--threads``), so a
process is one core's worth of work. Each rank reads its own synthetic
per-rank batch (auto_shard_policy OFF), so the per-rank batch is fixed.

(1) In one process, plain Keras and ``DDLStrategy`` (a world of one) train
    the same model, interleaved repetitions; ``ratio`` = DDLStrategy's step
    time / plain Keras' (target <= 1.03).
(2) Launches (3) with 1 rank and with N ranks (``mpiexec -bind-to core``),
    alternating ``--rounds`` times, and reports ``efficiency`` = step time
    with 1 rank / step time with N ranks, same per-rank batch (target >=
    0.95). The 1-rank run is the same DDLStrategy program in a world of
    one, so it also pays nothing for the engine that N ranks run.
(3) DDLStrategy's step time with N ranks (the slowest rank's).
    With ``--independent`` every rank trains plain Keras on its own, no
    collectives: (2) runs this too, as the control that separates what N
    processes cost each other through the machine (shared caches, memory
    bandwidth, SMT siblings) from what communication costs:
    ``efficiency = machine x communication``, where ``machine`` = 1 rank /
    N independent ranks and ``communication`` = N independent / N ranks.

A repetition is one ``fit`` of ``--steps`` steps; a step's time is the
interval between consecutive ``on_train_batch_end`` calls (the first step
left out), the median over the fit's steps, so the per-call cost of ``fit``
(iterator set-up and teardown, which in TensorFlow 2.21 can hold a call for
up to ~0.3 s) is not counted. ``*_ms`` columns are medians over repetitions,
``*_min`` the fastest repetition (what to read on a machine shared with
other jobs), ``*_cpu`` the process CPU time per step (all threads), which
other jobs do not inflate but which leaves out waiting for other ranks.

Gradient layout: ``--overlap on|off`` makes the DDLStrategy models use
``overlap_gradients=True|False`` (default: the strategy's own, on).
``--overlap both`` with (3) trains a second DDLStrategy model with
``overlap_gradients=False`` in the same processes, interleaved with the
first, and adds a table: ``overlap_ms / grouped_ms`` (below 1: overlapping
the gradient allreduces with backprop pays) and whether both layouts ended
with bitwise-identical weights::

    mpiexec -n 2 -bind-to core python -m keras_ddl.bench fit --overlap both

(The launchers of ``--cluster`` pass the choice to their ranks as
``DDL_BENCH_FIT_OVERLAP``, which a rank reads when ``--overlap`` is not
given.)
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

CNN_IMAGE = 32
CNN_CLASSES = 10
RESNET_CLASSES = 1000


def _cnn(keras, image_size):
    layers = keras.layers
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(CNN_CLASSES),
    ])


def _resnet50(keras, image_size):
    # Keras' own ResNet-50 (25.6 M parameters, 214 trainable tensors), logits out
    return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                       classes=RESNET_CLASSES, classifier_activation=None)


OVERLAP_ENV = "DDL_BENCH_FIT_OVERLAP"


def _overlap_choice(args=None):
    """--overlap, else DDL_BENCH_FIT_OVERLAP (set by the cluster launcher),
    else None (the strategy's default)."""
    value = getattr(args, "overlap", None) or os.environ.get(OVERLAP_ENV, "")
    if value not in ("", "on", "off", "both"):
        raise SystemExit(f"{OVERLAP_ENV} must be on, off or both, got {value!r}")
    return value or None


def _digest(model):
    return hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes()
                                   for w in model.get_weights())).hexdigest()


def _image_size(args):
    return args.image_size or (224 if args.model == "resnet50" else CNN_IMAGE)


def _build(keras, args):
    build = _resnet50 if args.model == "resnet50" else _cnn
    return build(keras, _image_size(args))


def _classes(args):
    return RESNET_CLASSES if args.model == "resnet50" else CNN_CLASSES


def _compile(keras, model):
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _synthetic(tf, args, seed):
    rng = np.random.default_rng(seed)
    size = _image_size(args)
    x = rng.random((args.batch, size, size, 3), dtype=np.float32)
    y = rng.integers(0, _classes(args), args.batch)
    options = tf.data.Options()
    # each rank's dataset is already its own per-replica batch
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf.data.Dataset.from_tensors((x, y)).repeat().with_options(options)


class _StepClock:
    """Wall and CPU time at the end of every training step of one fit."""

    def __init__(self, keras):
        clock = self

        class Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                clock.marks = []

            def on_train_batch_end(self, batch, logs=None):
                clock.marks.append((time.perf_counter(), time.process_time()))

        self.callback = Callback()
        self.marks = []

    def per_step(self):
        """Median (wall, cpu) seconds of a step, the first one left out."""
        steps = np.diff(np.array(self.marks), axis=0)
        return float(np.median(steps[:, 0])), float(np.median(steps[:, 1]))


def _pin_to_rank_core():
    """DDL_BENCH_PIN_RANK=1: this rank runs on core (rank mod cores), set
    before TensorFlow starts its threads (they inherit it). For launches
    whose ranks the launcher cannot bind, e.g. one per namespace node."""
    if os.environ.get("DDL_BENCH_PIN_RANK") != "1" or not hasattr(os, "sched_setaffinity"):
        return
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


COMPRESSION_ENV = "DDL_BENCH_FIT_COMPRESSION"


def _compression(ddl):
    value = os.environ.get(COMPRESSION_ENV, "none")
    if value not in ("none", "fp16", "bf16"):
        raise SystemExit(f"{COMPRESSION_ENV} must be none, fp16 or bf16, got {value!r}")
    return getattr(ddl.Compression, value)


def _measure(args):
    """Runs in every rank: {"plain": [...], "ddl": [...]} (wall, cpu) per step."""
    _pin_to_rank_core()
    import tensorflow as tf
    # one core's worth of work per process; must precede any TensorFlow op
    # (`bench all` sets them before its first op and skips this)
    if tf.config.threading.get_intra_op_parallelism_threads() != args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    if tf.config.threading.get_inter_op_parallelism_threads() != args.threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    import keras_ddl as ddl

    from .common import COMM

    ddl.init()
    size, rank = ddl.size(), ddl.rank()
    overlap = _overlap_choice(args)
    compression = _compression(ddl)
    strategy = ddl.DDLStrategy(compression=compression) if overlap is None else \
        ddl.DDLStrategy(overlap_gradients=overlap != "off", compression=compression)
    keras.utils.set_random_seed(0)
    with_plain = (size == 1 and not getattr(args, "ddl_only", False)) or args.independent
    plain = _compile(keras, _build(keras, args)) if with_plain else None
    with strategy.scope():
        distributed = _compile(keras, _build(keras, args))
    grouped = None
    if overlap == "both" and not args.independent:
        with ddl.DDLStrategy(overlap_gradients=False).scope():
            grouped = _compile(keras, _build(keras, args))
        grouped.set_weights(distributed.get_weights())
    data = _synthetic(tf, args, seed=rank)
    clock = _StepClock(keras)

    # With DDL_TIMELINE set, each step's start is marked in the trace
    # (bench/timeline_overlap.py reads the trace step by step).
    marks = [ddl.callbacks.TimelineCallback()] if os.environ.get("DDL_TIMELINE") else []

    def timed(model):
        COMM.Barrier()
        model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0,
                  callbacks=[clock.callback, *marks])
        return clock.per_step()

    if args.independent:
        models = {"plain": plain}
    else:
        models = {"ddl": distributed} if plain is None else {"plain": plain, "ddl": distributed}
        if grouped is not None:
            models["ddl_grouped"] = grouped
    for model in models.values():
        timed(model)  # warm-up: tracing
    results = {name: [] for name in models}
    for _ in range(args.reps):  # interleaved: both see the same machine state
        for name, model in models.items():
            wall, cpu = timed(model)
            # a step of N ranks lasts as long as its slowest rank's
            walls, cpus = zip(*COMM.allgather((wall, cpu)))
            results[name].append((max(walls), max(cpus)))
    digest = _digest(distributed)
    affinity = COMM.allgather(sorted(os.sched_getaffinity(0))
                              if hasattr(os, "sched_getaffinity") else None)
    return {
        "ranks": size, "batch_per_rank": args.batch, "steps": args.steps, "reps": args.reps,
        "threads": args.threads, "model": args.model,
        "image_size": _image_size(args),
        "params": int(sum(np.prod(w.shape) for w in distributed.trainable_weights)),
        "cores": ";".join(",".join(map(str, a)) if a else "?" for a in affinity),
        "identical": len(set(COMM.allgather(digest))) == 1,
        "overlap_gradients": strategy.extended._overlap,
        # both layouts trained the same steps from the same weights on the same data
        "layouts_identical": None if grouped is None else all(
            COMM.allgather(_digest(grouped) == digest)),
        "step_s": results,
    }


def _summary(samples):
    walls = [w for w, _ in samples]
    cpus = [c for _, c in samples]
    return float(np.median(walls)), float(np.min(walls)), float(np.median(cpus))


def _model_label(result):
    model, params = result.get("model", "cnn"), result["params"]
    size = result.get("image_size", CNN_IMAGE)
    if params >= 1e6:
        return f"{model} {size}px {params / 1e6:.1f}M params"
    return f"{model} {size}px {params // 1000}k params"


def _print_measurement(result):
    from .common import print_table
    if "ddl" not in result["step_s"]:  # --independent
        plain_ms, plain_min, plain_cpu = (1e3 * v for v in _summary(result["step_s"]["plain"]))
        rows = [{"model": _model_label(result), "ranks": result["ranks"],
                 "batch_per_rank": result["batch_per_rank"], "cores": result["cores"],
                 "plain_ms": plain_ms, "plain_min": plain_min, "plain_cpu": plain_cpu}]
        print_table(f"fit step time, {result['ranks']} independent plain-Keras processes "
                    "(no collectives)", list(rows[0]), rows)
        return {"fit": rows}
    ddl_ms, ddl_min, ddl_cpu = (1e3 * v for v in _summary(result["step_s"]["ddl"]))
    if "plain" in result["step_s"]:
        plain_ms, plain_min, plain_cpu = (1e3 * v for v in _summary(result["step_s"]["plain"]))
        rows = [{"model": _model_label(result), "batch": result["batch_per_rank"],
                 "steps": result["steps"], "reps": result["reps"], "cores": result["cores"],
                 "plain_ms": plain_ms, "ddl_ms": ddl_ms, "ratio": ddl_ms / plain_ms,
                 "plain_min": plain_min, "ddl_min": ddl_min, "ratio_min": ddl_min / plain_min,
                 "plain_cpu": plain_cpu, "ddl_cpu": ddl_cpu, "ratio_cpu": ddl_cpu / plain_cpu,
                 "target": "<=1.03"}]
        print_table(f"fit step time, one process, {result['threads']} TF thread(s): "
                    f"DDLStrategy vs plain Keras, {result['reps']} interleaved repetitions",
                    list(rows[0]), rows)
        tables = {"fit": rows}
    else:
        rows = [{"model": _model_label(result), "ranks": result["ranks"],
                 "batch_per_rank": result["batch_per_rank"], "steps": result["steps"],
                 "reps": result["reps"], "cores": result["cores"], "ddl_ms": ddl_ms,
                 "ddl_min": ddl_min, "ddl_cpu": ddl_cpu,
                 "img_per_s": result["ranks"] * result["batch_per_rank"] / ddl_ms * 1e3,
                 "identical": "yes" if result["identical"] else "NO"}]
        print_table(f"fit step time, DDLStrategy on {result['ranks']} ranks x "
                    f"{result['threads']} TF thread(s), {result['reps']} repetitions "
                    "(weak scaling against 1 rank: --scaling N)", list(rows[0]), rows)
        tables = {"fit": rows}
    if "ddl_grouped" in result["step_s"]:
        grouped_ms, grouped_min, grouped_cpu = (
            1e3 * v for v in _summary(result["step_s"]["ddl_grouped"]))
        rows = [{"model": _model_label(result), "ranks": result["ranks"],
                 "batch_per_rank": result["batch_per_rank"], "overlap_ms": ddl_ms,
                 "grouped_ms": grouped_ms, "ratio": ddl_ms / grouped_ms, "overlap_min": ddl_min,
                 "grouped_min": grouped_min, "ratio_min": ddl_min / grouped_min,
                 "overlap_cpu": ddl_cpu, "grouped_cpu": grouped_cpu,
                 "same_bits": "yes" if result["layouts_identical"] else "NO"}]
        print_table("gradient layout: one allreduce per gradient overlapping backprop "
                    "(overlap_gradients=True) vs one grouped allreduce after it (False), "
                    f"{result['reps']} interleaved repetitions", list(rows[0]), rows)
        tables["layout"] = rows
    return tables


def _mpiexec():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    path = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if path is None:
        raise SystemExit("keras_ddl.bench fit --scaling: mpiexec not found")
    return path


def _launch(args, ranks, path, independent=False):
    argv = [_mpiexec(), "-n", str(ranks), "-bind-to", "core", sys.executable, "-m",
            "keras_ddl.bench", "fit", "--batch", str(args.batch), "--steps", str(args.steps),
            "--reps", str(args.reps), "--threads", str(args.threads), "--json", path,
            "--model", args.model]
    if args.image_size:
        argv += ["--image-size", str(args.image_size)]
    if independent:
        argv.append("--independent")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(path) as f:
        return json.load(f)


def _scaling(args):
    """Alternating launches with 1 and N ranks; prints the weak-scaling table."""
    n = args.scaling
    samples = {1: [], n: [], "independent": []}
    meta = {}
    with tempfile.TemporaryDirectory(prefix="ddl_bench_fit_") as tmp:
        for round_ in range(args.rounds):
            for ranks in (1, n, "independent"):
                path = os.path.join(tmp, f"{ranks}.{round_}.json")
                if ranks == "independent":
                    result = _launch(args, n, path, independent=True)
                    samples[ranks] += result["step_s"]["plain"]
                else:
                    result = _launch(args, ranks, path)
                    samples[ranks] += result["step_s"]["ddl"]
                meta[ranks] = result
    one, one_min, one_cpu = (1e3 * v for v in _summary(samples[1]))
    many, many_min, many_cpu = (1e3 * v for v in _summary(samples[n]))
    alone, alone_min, _ = (1e3 * v for v in _summary(samples["independent"]))
    row = {"model": _model_label(meta[n]), "ranks": n, "batch_per_rank": args.batch,
           "steps": args.steps, "reps": args.reps * args.rounds, "cores": meta[n]["cores"],
           "1rank_ms": one, f"{n}rank_ms": many, "efficiency": one / many,
           "1rank_min": one_min, f"{n}rank_min": many_min, "efficiency_min": one_min / many_min,
           "1rank_cpu": one_cpu, f"{n}rank_cpu": many_cpu, "efficiency_cpu": one_cpu / many_cpu,
           f"{n}x1_indep_ms": alone, "machine": one / alone, "communication": alone / many,
           "img_per_s": n * args.batch / many * 1e3,
           "identical": "yes" if meta[n]["identical"] else "NO", "target": ">=0.95"}
    _print_rows(f"weak scaling: DDLStrategy on 1 rank vs {n} ranks, one core each "
                f"(mpiexec -bind-to core), {args.threads} TF thread(s), same per-rank batch; "
                f"{args.rounds} alternating launches x {args.reps} repetitions", [row])
    if args.json:
        from keras_ddl_tools.results import write_json
        write_json(args.json, {"scaling": row,
                               "step_s": {str(k): v for k, v in samples.items()}})


def _print_rows(title, rows):
    # the driver is not an MPI process: print here rather than via common
    columns = list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
        return str(v)
    widths = {c: max(len(c), *(len(fmt(r[c])) for r in rows)) for c in columns}
    print(f"# {title}")
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(fmt(r[c]).rjust(widths[c]) for c in columns), flush=True)


def main(args):
    if args.steps < 3:
        raise SystemExit("--steps must be at least 3")
    if args.scaling:
        if args.scaling < 2:
            raise SystemExit("--scaling takes the number of ranks to compare with 1 (>= 2)")
        _scaling(args)
        return
    result = _measure(args)
    from .common import dump_json
    tables = _print_measurement(result)
    dump_json(args.json, dict(result, **tables))  # the printed rows too: results files merge them
