"""``python -m keras_ddl.bench {allreduce,fit,model}``; prints tables (see BENCHMARKS.md)."""

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
    mo = sub.add_parser("model", help="alpha-beta scaling model: predicted efficiency at "
                                      "8 ... 1024 GPUs vs published points (no launcher needed)")
    from . import model
    model.add_arguments(mo)
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
    fit.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if getattr(args, "reps", 1) < 1:
        parser.error("--reps must be >= 1")
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command == "allreduce":
        from . import allreduce
        allreduce.main(args)
    elif args.command == "fit":
        from . import fit
        fit.main(args)
    elif args.command == "model":
        from . import model
        model.main(args)


if __name__ == "__main__":
    main()
