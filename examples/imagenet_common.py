"""Shared code of resnet50_imagenet1k.py and resnet101_imagenet22k.py.

The ResNet is built here (v1.5 bottleneck: stride on the 3x3 conv), not
taken from keras.applications, so that the last BatchNorm of every residual
block can start with gamma = 0 (Goyal et al. 2017: each block starts as the
identity). Distribution uses ddl.DistributedOptimizer + callbacks.
"""

import argparse
import glob
import os
import sys
import time

import numpy as np

BLOCKS = {14: [1, 1, 1, 1], 26: [2, 2, 2, 2], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3],
          152: [3, 8, 36, 3]}


# Base learning rate per 256 images, by optimizer, when --base-lr is not
# given. SGD: Goyal et al. 2017. LARS: 10 per 256 with trust coefficient
# eeta = 0.001 (You, Gitman & Ginsburg 2017), the rate of README.md's
# "Large-batch training" and of examples/large_batch_study.py: a LARS step
# moves a layer by about lr * eeta of its norm, so 10 * 0.001 = 1% per step,
# as SGD's 0.1 does when ||g|| / ||w|| ~ 0.1. Measured on the study's model;
# for another model check that ratio first.
BASE_LR = {"sgd": 0.1, "lars": 10.0}
LARS_EETA = 0.001


class _HelpFormatter(argparse.RawDescriptionHelpFormatter,
                     argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def parse_args(description, defaults, argv=None):
    """The flags of both ResNet examples.

    Args:
        description: The calling script's docstring (shown whole by --help).
        defaults: The script's defaults (see DEFAULTS in each script).
        argv: The arguments (default: sys.argv[1:]).
    """
    p = argparse.ArgumentParser(description=description, formatter_class=_HelpFormatter)
    p.add_argument("--data-dir", help="directory of TFRecord shards <split>-* written by "
                   "convert_image_folder.py (see keras_ddl.data)")
    p.add_argument("--synthetic", action="store_true",
                   help="random data of the right shape instead of --data-dir (for "
                   "throughput; the accuracy is meaningless)")
    p.add_argument("--global-batch", type=int, default=defaults["global_batch"],
                   help="images per step over all ranks, whatever their number (a rank "
                   "takes global // ranks images, the first global %% ranks one more); keep "
                   "it across restarts")
    p.add_argument("--epochs", type=int, default=defaults["epochs"], help="epochs to train")
    p.add_argument("--warmup-epochs", type=float, default=defaults["warmup_epochs"],
                   help="linear learning-rate warmup, in epochs")
    p.add_argument("--image-size", type=int, default=224, help="training and eval crop, pixels")
    p.add_argument("--num-classes", type=int, default=defaults["num_classes"],
                   help="classes (labels 0..N-1)")
    p.add_argument("--train-images", type=int, default=defaults["train_images"],
                   help="images per epoch, for the default --steps-per-epoch")
    p.add_argument("--steps-per-epoch", type=int,
                   help="default: --train-images // --global-batch")
    p.add_argument("--eval-split", default="validation",
                   help="held-out split <split>-* in --data-dir, evaluated after every epoch "
                   "(top-1 printed as val_top1); 'none' skips evaluation")
    p.add_argument("--eval-images", type=int, default=defaults["eval_images"],
                   help="images of the held-out split evaluated each time (rounded down to "
                   "whole global batches)")
    p.add_argument("--lr", type=float, help="peak learning rate (default: linear scaling rule "
                   "from --base-lr at batch 256)")
    p.add_argument("--base-lr", type=float,
                   help=f"learning rate per 256 images (default by optimizer: {BASE_LR})")
    p.add_argument("--optimizer", choices=["lars", "sgd"], default=defaults["optimizer"],
                   help="LARS (keras_ddl.optimizers.LARS) or SGD with Nesterov momentum")
    p.add_argument("--lars-eeta", type=float, default=LARS_EETA,
                   help="LARS trust coefficient (You, Gitman & Ginsburg 2017)")
    p.add_argument("--momentum", type=float, default=0.9, help="momentum of either optimizer")
    p.add_argument("--weight-decay", type=float, default=defaults["weight_decay"],
                   help="on conv and dense kernels only (LARS: inside the update; SGD: as "
                   "an L2 penalty)")
    p.add_argument("--label-smoothing", type=float, default=0.1, help="of the training loss")
    p.add_argument("--depth", type=int, choices=sorted(BLOCKS), default=defaults["depth"],
                   help="ResNet depth")
    p.add_argument("--width-multiplier", type=float, default=1.0,
                   help="scales every layer's width (tiny models for tests)")
    p.add_argument("--distribution", choices=["optimizer", "strategy"], default="optimizer",
                   help="ddl.DistributedOptimizer + callbacks, or ddl.DDLStrategy")
    p.add_argument("--mixed-bfloat16", action="store_true",
                   help="Keras mixed_bfloat16 policy (float32 logits)")
    p.add_argument("--checkpoint-dir", default="checkpoints",
                   help="rank 0 writes ddl.callbacks.BackupAndRestore backups here (the "
                   "newest two are kept)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="back up every N steps (and at the end); 0: at every epoch's end")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest backup in --checkpoint-dir, at any number "
                   "of ranks (without it, a directory holding backups is an error)")
    p.add_argument("--seed", type=int, default=0, help="weights, shuffling and augmentation")
    a = p.parse_args(argv)
    if not a.synthetic and not a.data_dir:
        p.error("give --data-dir or --synthetic")
    if a.base_lr is None:
        a.base_lr = BASE_LR[a.optimizer]
    if a.eval_images < 1:
        p.error(f"--eval-images must be >= 1, got {a.eval_images}")
    if a.checkpoint_every < 0:
        p.error(f"--checkpoint-every must be >= 0, got {a.checkpoint_every}")
    if a.eval_split != "none" and a.data_dir:
        if not glob.glob(os.path.join(a.data_dir, f"{a.eval_split}-*")):
            p.error(f"--eval-split {a.eval_split}: no {a.eval_split}-* files in {a.data_dir} "
                    "(convert a held-out split with convert_image_folder.py --split "
                    f"{a.eval_split}, or pass --eval-split none)")
    return a


# ---------------------------------------------------------------- model

def build_resnet(keras, depth, num_classes, image_size, width=1.0, l2=0.0):
    """ResNet-v1.5 with zero-initialised last BN gamma in each residual block.

    ``l2 > 0`` adds an L2 penalty on conv/dense kernels only (no decay on
    BN parameters or biases); with LARS pass 0 and let LARS decay."""
    layers = keras.layers
    reg = keras.regularizers.L2(l2) if l2 else None
    bn_axis = -1

    def conv(x, filters, k, stride, name):
        return layers.Conv2D(filters, k, strides=stride, padding="same", use_bias=False,
                             kernel_initializer="he_normal", kernel_regularizer=reg,
                             name=name)(x)

    def bn(x, name, zero_gamma=False):
        return layers.BatchNormalization(axis=bn_axis, momentum=0.9, epsilon=1e-5, name=name,
                                         gamma_initializer="zeros" if zero_gamma else "ones")(x)

    def block(x, filters, stride, name):
        out = 4 * filters
        shortcut = x
        if stride != 1 or x.shape[-1] != out:
            shortcut = conv(x, out, 1, stride, name + "_proj")
            shortcut = bn(shortcut, name + "_proj_bn")
        y = layers.ReLU()(bn(conv(x, filters, 1, 1, name + "_conv1"), name + "_bn1"))
        y = layers.ReLU()(bn(conv(y, filters, 3, stride, name + "_conv2"), name + "_bn2"))
        y = bn(conv(y, out, 1, 1, name + "_conv3"), name + "_bn3", zero_gamma=True)
        return layers.ReLU()(layers.Add()([shortcut, y]))

    def w(n):
        return max(1, int(round(n * width)))

    inputs = keras.Input((image_size, image_size, 3))
    x = layers.ReLU()(bn(conv(inputs, w(64), 7, 2, "stem_conv"), "stem_bn"))
    x = layers.MaxPooling2D(3, 2, padding="same")(x)
    for stage, (n, filters) in enumerate(zip(BLOCKS[depth], (64, 128, 256, 512))):
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            x = block(x, w(filters), stride, f"s{stage + 1}b{i + 1}")
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(num_classes, kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
                     kernel_regularizer=reg, name="logits")(x)
    x = layers.Activation("linear", dtype="float32")(x)  # float32 logits under mixed precision
    return keras.Model(inputs, x, name=f"resnet{depth}")


# ---------------------------------------------------------------- checkpoints

def weights_checksum(model):
    return float(sum(np.sum(np.abs(w.astype(np.float64))) for w in model.get_weights()))


# ---------------------------------------------------------------- training

def main(description, defaults, argv=None):
    args = parse_args(description, defaults, argv)
    import keras
    import tensorflow as tf
    import keras_ddl as ddl
    from keras_ddl import data, schedules
    from keras_ddl.optimizers import LARS

    ddl.init()
    rank, size = ddl.rank(), ddl.size()
    keras.utils.set_random_seed(args.seed)  # same seed: rank 0's weights are broadcast anyway

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    # The global batch is the run's, whatever the number of ranks (a job
    # restarted on fewer servers keeps it): each rank takes its share.
    if args.global_batch < size:
        raise SystemExit(f"--global-batch {args.global_batch} is smaller than {size} ranks")
    per_rank = data.rows_of_rank(args.global_batch, rank, size)[1]
    data.warn_uneven_global_batch(args.global_batch, size)
    steps = args.steps_per_epoch or max(1, args.train_images // args.global_batch)
    if args.mixed_bfloat16:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")

    # Backups every --checkpoint-every steps, resumed at any world size.
    backup = ddl.callbacks.BackupAndRestore(args.checkpoint_dir,
                                            save_freq=args.checkpoint_every or "epoch",
                                            global_batch_size=args.global_batch)
    position = backup.resume_position()
    if position.iterations and not args.resume:
        raise SystemExit(f"--checkpoint-dir {args.checkpoint_dir} holds a backup (epoch "
                         f"{position.epoch}, step {position.step}): pass --resume to continue "
                         "from it, or give another directory")
    # The training input is an endless shuffled stream of each rank's files,
    # not an epoch-exact order: a resumed run restarts it with a seed drawn
    # from the step it resumes at (so it does not replay the first images)
    # and the file shards of the new world size. The backup then keeps no
    # iterator state (an ImageNet shuffle buffer would make each backup
    # gigabytes); keras_ddl.data.sample_index_dataset is the epoch-exact way.
    backup.use_positioned_input()
    stream_seed = args.seed + rank + 1_000_003 * position.iterations
    if args.synthetic:
        ds = data.synthetic_dataset(args.image_size, args.num_classes, per_rank, seed=args.seed)
    else:
        ds = data.imagenet_dataset(args.data_dir, "train", args.image_size, per_rank,
                                   training=True, rank=rank, size=size, seed=stream_seed)

    # The held-out split: every rank evaluates the same number of batches of
    # its own files (repeated, so a rank with fewer images never runs short
    # while the others wait), and the metric is averaged over the ranks.
    eval_steps = max(1, args.eval_images // args.global_batch)
    if args.eval_split == "none":
        eval_ds = None
    elif args.synthetic:
        eval_ds = data.synthetic_dataset(args.image_size, args.num_classes, per_rank,
                                         seed=args.seed + 1)
    else:
        eval_ds = data.imagenet_dataset(args.data_dir, args.eval_split, args.image_size,
                                        per_rank, training=False, rank=rank, size=size,
                                        repeat=True)

    peak = args.lr or schedules.linear_scaling_rule(args.base_lr, args.global_batch)
    total = args.epochs * steps
    warmup = min(int(args.warmup_epochs * steps), total - 1) if total > 1 else 0
    lr = schedules.PolynomialDecayWithWarmup(peak, total_steps=total, warmup_steps=warmup,
                                             power=2.0)
    use_strategy = args.distribution == "strategy"
    # With DDLStrategy the strategy averages the gradients and broadcasts the
    # initial weights; the dataset is per rank (auto-shard OFF), so it is
    # taken as this replica's share with the per-rank batch. The optimizer
    # and the model are both made under its scope.
    strategy = ddl.DDLStrategy() if use_strategy else tf.distribute.get_strategy()
    with strategy.scope():
        if args.optimizer == "lars":
            base = LARS(learning_rate=lr, momentum=args.momentum,
                        weight_decay=args.weight_decay, eeta=args.lars_eeta)
            l2 = 0.0   # LARS decays kernels only (biases and BN excluded by default)
        else:
            base = keras.optimizers.SGD(learning_rate=lr, momentum=args.momentum, nesterov=True)
            l2 = args.weight_decay / 2   # d/dw (wd/2 * w^2) = wd * w, on kernels only
        opt = base if use_strategy else ddl.DistributedOptimizer(base, name="resnet_opt")

    with strategy.scope():
        model = build_resnet(keras, args.depth, args.num_classes, args.image_size,
                             args.width_multiplier, l2)
        model.compile(optimizer=opt,
                      loss=keras.losses.CategoricalCrossentropy(
                          from_logits=True, label_smoothing=args.label_smoothing),
                      metrics=["accuracy"], jit_compile=False)
    # The labels are sparse; one-hot them in the pipeline for label smoothing.
    ds = ds.map(lambda x, y: (x, tf.one_hot(y, args.num_classes)))
    if eval_ds is not None:
        eval_ds = eval_ds.map(lambda x, y: (x, tf.one_hot(y, args.num_classes)))

    if position.epoch >= args.epochs:
        log(f"already trained {position.epoch} epochs (--epochs {args.epochs}): nothing to do")
        return 0

    log(f"resnet{args.depth} width x{args.width_multiplier} classes={args.num_classes} "
        f"image={args.image_size} ranks={size} global_batch={args.global_batch} "
        f"per_rank={per_rank} steps/epoch={steps} optimizer={args.optimizer} peak_lr={peak:g} "
        f"warmup_steps={warmup} data={'synthetic' if args.synthetic else args.data_dir} "
        f"bf16={args.mixed_bfloat16} distribution={args.distribution} "
        f"eval={args.eval_split}:{eval_steps * args.global_batch}images")

    class Report(keras.callbacks.Callback):
        """Rank 0: the backup resumed from, step time and images/s (skipping
        each epoch's first step, which includes tracing), loss, and the
        newest backup at the end."""

        def on_train_begin(self, logs=None):
            p = backup.position
            if p.iterations:
                log(f"RESUMED epoch={p.epoch} step={p.step} iterations="
                    f"{int(opt.iterations.numpy())} world={p.world_size} "
                    f"checksum={weights_checksum(model):.6f}")

        def on_epoch_begin(self, epoch, logs=None):
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.t0)

        def on_epoch_end(self, epoch, logs=None):
            if rank != 0:
                return
            t = self.times[1:] or self.times
            step = sum(t) / len(t)
            loss = float(logs.get("loss", float("nan")))
            # Top-1 on the held-out split: Keras' "accuracy" against one-hot
            # labels is the argmax match, averaged over the ranks' equal shares.
            top1 = (f"val_top1={float(logs['val_accuracy']):.4f} "
                    if "val_accuracy" in logs else "")
            print(f"EPOCH {epoch + 1}/{args.epochs} loss={loss:.6f} "
                  f"accuracy={float(logs.get('accuracy', float('nan'))):.4f} {top1}"
                  f"step_time_ms={1000 * step:.1f} images_per_s_per_rank={per_rank / step:.1f} "
                  f"images_per_s_total={args.global_batch / step:.1f}", flush=True)

        def on_train_end(self, logs=None):
            # After BackupAndRestore's own on_train_end: the final backup is written.
            if rank == 0 and backup.backups():
                (epoch, step), path = backup.backups()[-1]
                print(f"CHECKPOINT rank={rank} epoch={epoch} step={step} path={path} "
                      f"checksum={weights_checksum(model):.6f}", flush=True)

    # BackupAndRestore first: the callbacks after it see the restored state.
    callbacks = [backup, Report()] if use_strategy else [
        backup, ddl.callbacks.BroadcastGlobalVariablesCallback(0),
        ddl.callbacks.MetricAverageCallback(), Report()]
    model.fit(ds, epochs=args.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0,
              shuffle=False, validation_data=eval_ds,
              validation_steps=eval_steps if eval_ds is not None else None)
    log("DONE")
    return 0


if __name__ == "__main__":
    sys.exit("run resnet50_imagenet1k.py or resnet101_imagenet22k.py")
