"""Repeated allreduces of one gradient-sized tensor, for watching the
autotuner (DDL_AUTOTUNE=1) choose an algorithm, a fusion threshold and a
cycle time on a real network.

Every call reduces the same float32 tensor under one name, so it falls in
one size class and each call is one cycle of the engine. With
DDL_AUTOTUNE=1, rank 0 prints on stderr the table of the algorithms it
timed and chose as soon as they are chosen, then the fusion thresholds and
cycle times it tried and the one it kept; this script prints each call's
time on rank 0 at the end. By default it runs enough calls for both
phases to finish with the DDL_AUTOTUNE_STEPS and DDL_AUTOTUNE_CYCLES of
its environment, and 10 more with the choice. For example, fp16 on the
uplinks against plain float32 on the test cluster's racks (as root):

    DDL_AUTOTUNE=1 DDL_UPLINK_COMPRESSION=auto \\
    python -m keras_ddl.cluster run \\
        --racks 2 --nodes 4 --rate 1gbit --uplink 250mbit -- \\
        python examples/autotune_allreduce.py
"""

import argparse
import os
import statistics
import time

# The autotuner's defaults (custom_ops/common/config.h) and the most it
# tries in one size class (custom_ops/engine/executor.cc: at most 5
# algorithms, the rack grid's with DDL_UPLINK_COMPRESSION=auto; 7 fusion
# threshold and cycle time settings).
DEFAULT_STEPS = 5
DEFAULT_CYCLES = 5
MOST_ALGORITHMS = 5
MOST_SETTINGS = 7
CALLS_AFTER_TUNING = 10


def calls_to_finish(environ):
    """Calls that let DDL_AUTOTUNE=1 finish both phases, then
    CALLS_AFTER_TUNING with its choice: steps x algorithms batches, then
    steps x settings windows of `cycles` calls, and the call that closes the
    last window. An unset or malformed variable counts as its default (the
    library itself refuses a malformed one at init)."""
    def whole(name, default):
        value = environ.get(name, "")
        return int(value) if value.isdigit() and int(value) >= 1 else default

    steps = whole("DDL_AUTOTUNE_STEPS", DEFAULT_STEPS)
    cycles = whole("DDL_AUTOTUNE_CYCLES", DEFAULT_CYCLES)
    return steps * MOST_ALGORITHMS + steps * MOST_SETTINGS * cycles + 1 + CALLS_AFTER_TUNING


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The autotuner's tables are explained in docs/topology.md.")
    parser.add_argument("--calls", type=int, default=None,
                        help="The number of allreduces to run. By default, enough for the "
                             "autotuner to finish with the DDL_AUTOTUNE_STEPS and "
                             "DDL_AUTOTUNE_CYCLES in the environment (211 with their defaults "
                             f"of {DEFAULT_STEPS} and {DEFAULT_CYCLES}), then "
                             f"{CALLS_AFTER_TUNING} more with its choice.")
    parser.add_argument("--mb", type=float, default=16.0,
                        help="The tensor's size in MiB of float32 (default 16).")
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = calls_to_finish(os.environ)
    if args.calls < 1 or args.mb <= 0:
        parser.error(f"--calls must be >= 1 and --mb > 0 (got {args.calls}, {args.mb})")
    return args


def main():
    args = parse_args()

    import numpy as np
    import tensorflow as tf

    import keras_ddl as ddl
    ddl.init()
    count = int(args.mb * (1 << 20)) // 4
    x = tf.constant(np.random.default_rng(ddl.rank()).uniform(-1, 1, count).astype(np.float32))
    times = []
    for _ in range(args.calls):
        start = time.perf_counter()
        ddl.allreduce(x, op=ddl.Sum, name="grad").numpy()
        times.append(time.perf_counter() - start)
    if ddl.rank() == 0:
        print(f"{args.calls} allreduces of {args.mb:g} MiB on {ddl.size()} ranks; seconds per call:")
        print(" ".join(f"{t:.2f}" for t in times))
        last = min(CALLS_AFTER_TUNING, len(times))
        print(f"median of the last {last} calls: {statistics.median(times[-last:]):.3f} s")
    ddl.shutdown()


if __name__ == "__main__":
    main()
