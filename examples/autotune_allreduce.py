"""Repeated allreduces of one gradient-sized tensor, for watching the
autotuner (DDL_AUTOTUNE=1) choose on a real network.

Every call reduces the same float32 tensor under one name, so it falls in
one size class; with DDL_AUTOTUNE=1 rank 0 prints the table of what it
measured and chose on stderr, and this script prints each call's time on
rank 0. For example, fp16 on the uplinks against plain float32 on the test
cluster's racks (as root):

    DDL_AUTOTUNE=1 DDL_AUTOTUNE_CYCLES=1 DDL_UPLINK_COMPRESSION=auto \\
    python -m keras_ddl.cluster run \\
        --racks 2 --nodes 4 --rate 1gbit --uplink 250mbit -- \\
        python examples/autotune_allreduce.py --calls 65 --mb 64
"""

import argparse
import statistics
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=65,
                        help="allreduces to run (default 65: with the default "
                             "DDL_AUTOTUNE_STEPS=5 and DDL_AUTOTUNE_CYCLES=1, enough for 5 "
                             "candidates' batches and 7 settings' windows)")
    parser.add_argument("--mb", type=float, default=64.0,
                        help="tensor size in MiB of float32 (default 64)")
    args = parser.parse_args()
    if args.calls < 1 or args.mb <= 0:
        parser.error(f"--calls must be >= 1 and --mb > 0 (got {args.calls}, {args.mb})")

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
        print(f"median of the last 10 calls: {statistics.median(times[-10:]):.3f} s")
    ddl.shutdown()


if __name__ == "__main__":
    main()
