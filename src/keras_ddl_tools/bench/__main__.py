"""``python -m keras_ddl.bench {allreduce,mwms,fit,syncbn,backup,all,model,peers}``; prints tables
(docs/PERFORMANCE.md says how they are read and kept as results files)."""

import argparse
import sys


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m keras_ddl.bench",
                                     description="keras_ddl benchmarks (run under mpiexec)")
    sub = parser.add_subparsers(dest="command", required=True)
    ar = sub.add_parser("allreduce", help="allreduce vs mpi4py, and the ResNet-50 gradient list")
    ar.add_argument("--sizes", help="comma-separated byte counts (default 4 KB ... 256 MB)")
    ar.add_argument("--reps", type=int, default=7, help="interleaved repetitions per size")
    ar.add_argument("--skip-resnet", action="store_true", help="skip the gradient-list table")
    ar.add_argument("--gradient-tensors", type=int, default=None,
                    help="use only the first N tensors of the ResNet-50 list (quick checks)")
    ar.add_argument("--json", help="also write the results to this JSON file")
    ar.add_argument("--plot", help="rank 0 writes a PNG of busbw vs size, ours and the "
                                   "baseline (needs matplotlib)")
    ar.add_argument("--with-fp16", action="store_true",
                    help="also time each size with Compression.fp16 (fp16_us column)")
    ar.add_argument("--cluster", metavar="KxR",
                    help="run on a cluster of K network namespaces with R ranks each (root; "
                         "do not start under mpiexec): every algorithm, fp16, MPICH and the "
                         "link bound in one table; RACKSxNxR for racks of N nodes behind "
                         "uplinks (--uplink)")
    ar.add_argument("--uplink", default=None,
                    help="with --cluster RACKSxNxR: each rack's uplink rate each way "
                         "(default: --rate)")
    ar.add_argument("--no-topology", action="store_true",
                    help="with --cluster RACKSxNxR: the ranks are told nothing about the "
                         "racks (no SLURM_TOPOLOGY_ADDR), as most jobs run")
    ar.add_argument("--rate", default="1gbit", help="with --cluster: link rate each way")
    ar.add_argument("--burst", default=None,
                    help="with --cluster: bytes each link's token bucket holds (64k, 1mb; "
                         "default: 2 ms at the rate, at least 256k)")
    ar.add_argument("--algorithms", help="with --cluster: comma-separated subset of "
                                         "auto,hierarchical,flat,racks,racks-fp16up,probe,none,"
                                         "unknown (default: auto, hierarchical, flat; with "
                                         "racks auto, racks and the two-level path; the first "
                                         "also runs fp16; racks-fp16up: racks with "
                                         "DDL_UPLINK_COMPRESSION=fp16; probe, none, unknown: "
                                         "auto with DDL_TOPOLOGY=probe, none or unknown)")
    ar.add_argument("--no-fp16", action="store_true",
                    help="with --cluster: the first algorithm's launches skip the fp16 timings "
                         "too, so every algorithm is timed alike")
    ar.add_argument("--with-resnet", action="store_true",
                    help="with --cluster: the first algorithm's launches also time the ResNet-50 "
                         "gradient list against mpi4py (a second table)")
    ar.add_argument("--rounds", type=int, default=1,
                    help="with --cluster: launches per algorithm (alternating); medians")
    mw = sub.add_parser("mwms", help="TensorFlow MultiWorkerMirroredStrategy all_reduce vs "
                                     "ours, same sizes and the ResNet-50 gradient list")
    mw.add_argument("--sizes", help="comma-separated byte counts (default 4 KB ... 64 MB)")
    mw.add_argument("--reps", type=int, default=5, help="interleaved repetitions per size")
    mw.add_argument("--gradient-tensors", type=int, default=None,
                    help="use only the first N tensors of the ResNet-50 list (quick checks)")
    mw.add_argument("--json", help="also write the results to this JSON file")
    al = sub.add_parser("all", help="mwms, allreduce and fit (this launch's N ranks) in one "
                                    "launch; JSON files get .mwms/.allreduce/.fit suffixes")
    al.add_argument("--quick", action="store_true", help="tiny sizes, one repetition")
    al.add_argument("--plot", help="busbw PNG of the allreduce table")
    al.add_argument("--json", help="JSON path prefix")
    mo = sub.add_parser("model", help="alpha-beta scaling model: predicted efficiency at "
                                      "8 ... 1024 GPUs vs published points (no launcher needed)")
    from keras_ddl_tools import scaling_model
    scaling_model.add_arguments(mo)
    fit = sub.add_parser("fit", help="model.fit step time: DDLStrategy vs plain Keras "
                                     "(one process), weak scaling (--scaling N)")
    fit.add_argument("--model", choices=["cnn", "resnet50"], default="cnn",
                     help="small CNN (default) or Keras' ResNet-50")
    fit.add_argument("--image-size", type=int,
                     help="synthetic image side (default: 32 for cnn, 224 for resnet50)")
    fit.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    fit.add_argument("--steps", type=int, default=10, help="steps per timed fit (>= 3)")
    fit.add_argument("--reps", type=int, default=7, help="interleaved repetitions")
    fit.add_argument("--threads", type=int, default=1,
                     help="TensorFlow intra-op and inter-op threads per process")
    fit.add_argument("--scaling", type=int, metavar="N",
                     help="launch 1 and N ranks (mpiexec -bind-to core) and report weak scaling")
    fit.add_argument("--rounds", type=int, default=3,
                     help="with --scaling: alternating launches per rank count")
    fit.add_argument("--independent", action="store_true",
                     help="each rank trains plain Keras alone (no collectives): the "
                          "control for --scaling")
    fit.add_argument("--overlap", choices=["on", "off", "both"],
                     help="the DDLStrategy model's overlap_gradients (default: the strategy's, "
                          "on); under mpiexec, both: a second model with it off, interleaved, "
                          "and a table comparing their step times")
    fit.add_argument("--ddl-only", action="store_true",
                     help="time only the DDLStrategy model (no plain-Keras model beside it)")
    fit.add_argument("--cluster", type=int, metavar="K",
                     help="weak scaling across K network-namespace nodes x 1 rank vs 1 rank, "
                          "overlap off/on x fp32/fp16 (root; do not start under mpiexec)")
    fit.add_argument("--rate", default="1gbit", help="with --cluster: link rate each way")
    fit.add_argument("--json", help="also write the results to this JSON file")
    sb = sub.add_parser("syncbn", help="model.fit step time of a 12-layer CNN with "
                                       "SyncBatchNormalization vs BatchNormalization, "
                                       "interleaved (run under mpiexec)")
    sb.add_argument("--image-size", type=int, default=32, help="synthetic image side")
    sb.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    sb.add_argument("--steps", type=int, default=10, help="steps per timed fit (>= 3)")
    sb.add_argument("--reps", type=int, default=8, help="interleaved repetitions")
    sb.add_argument("--threads", type=int, default=1,
                    help="TensorFlow intra-op and inter-op threads per process")
    sb.add_argument("--json", help="also write the results to this JSON file")
    bk = sub.add_parser("backup", help="what BackupAndRestore(save_freq=N) costs a ResNet-50 "
                                       "training step, written in the background or not "
                                       "(one process)")
    bk.add_argument("--batch", type=int, default=8, help="images per step")
    bk.add_argument("--image-size", type=int, default=224, help="synthetic image side")
    bk.add_argument("--steps", type=int, default=35, help="steps per timed fit")
    bk.add_argument("--save-freq", type=int, default=10, help="BackupAndRestore save_freq")
    bk.add_argument("--reps", type=int, default=3, help="repetitions per launch")
    bk.add_argument("--threads", type=int, default=0,
                    help="TensorFlow intra- and inter-op threads (0: TensorFlow's default)")
    bk.add_argument("--dir", help="where the backups are written (default: a temporary "
                                  "directory)")
    bk.add_argument("--json", help="also write the results to this JSON file")
    from . import peers
    pe = sub.add_parser("peers", help="the same script on Horovod and on keras_ddl's Horovod "
                                      "front door, each in its own Python environment, "
                                      "against MPICH (do not start under mpiexec)")
    peers.add_arguments(pe)
    args = parser.parse_args(argv)
    if args.command == "peers":
        peers.check_arguments(parser, args)
    if args.command == "backup" and (args.save_freq < 1 or args.steps < 3 * args.save_freq + 2):
        parser.error("backup: --save-freq must be >= 1 and --steps at least 3 x --save-freq "
                     "+ 2 (three saves inside the timed steps)")
    if getattr(args, "reps", 1) < 1:
        parser.error("--reps must be >= 1")
    return args


def _all(args):
    """The three MPI benchmarks in one launch. MWMS goes first: its strategy
    must be created before any other TensorFlow op."""
    import tensorflow as tf

    from . import allreduce, fit, mwms
    # fit's one-core-per-rank setting must precede TensorFlow's first op
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    quick = args.quick
    prefix = args.json

    def json_path(kind):
        return f"{prefix}.{kind}.json" if prefix else None

    mwms.main(argparse.Namespace(
        sizes="4096,1048576" if quick else None, reps=1 if quick else 5,
        gradient_tensors=8 if quick else None, json=json_path("mwms")))
    allreduce.main(argparse.Namespace(
        sizes="4096,1048576" if quick else None, reps=1 if quick else 7, skip_resnet=False,
        gradient_tensors=8 if quick else None, json=json_path("allreduce"), plot=args.plot))
    fit.main(argparse.Namespace(
        model="cnn", image_size=None, batch=4 if quick else 32, steps=3 if quick else 10,
        reps=1 if quick else 7, threads=1, scaling=None, rounds=1, independent=False,
        json=json_path("fit")))


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command == "all":
        _all(args)
    elif args.command == "mwms":
        from . import mwms
        mwms.main(args)
    elif args.command == "allreduce" and args.cluster:
        from . import allreduce, cluster
        sizes = ([int(v) for v in args.sizes.split(",")] if args.sizes
                 else allreduce.DEFAULT_SIZES)
        cluster.run(args, sizes, allreduce.human_bytes)
    elif args.command == "allreduce":
        from . import allreduce
        allreduce.main(args)
    elif args.command == "fit" and args.cluster:
        from . import fit_cluster
        fit_cluster.run(args)
    elif args.command == "fit":
        from . import fit
        fit.main(args)
    elif args.command == "syncbn":
        from . import syncbn
        syncbn.main(args)
    elif args.command == "peers":
        from . import peers
        peers.run(args)
    elif args.command == "backup":
        from . import backup
        backup.main(args)
    elif args.command == "model":
        from keras_ddl_tools import scaling_model as model
        model.main(args)


if __name__ == "__main__":
    main()
