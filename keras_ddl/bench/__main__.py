"""``python -m keras_ddl.bench {allreduce}`` under mpiexec; prints tables."""

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
    ar.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if getattr(args, "reps", 1) < 1:
        parser.error("--reps must be >= 1")
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command == "allreduce":
        from . import allreduce
        allreduce.main(args)


if __name__ == "__main__":
    main()
