"""What TensorFlow itself costs around a small op, with no keras_ddl and no
MPI: the floor under any collective that is a TensorFlow op.

    python docs/scripts/tf_floor.py [REPS]

Prints the median over REPS (default 300) of:
- one eager `tf.identity` of a 4 KB tensor;
- one call of a `tf.function` holding K dependent multiplies of that tensor,
  for K = 1, 20 and 100. TensorFlow's graph optimizer may fold the
  multiplies together, so the time hardly grows with K: what stays is the
  fixed cost of calling a function. A chain of K collectives inside one
  function (the chain rows of docs/scripts/small_calls.py, K = 20) pays 1/K
  of that cost per call on top of its own ops; the last column is that
  share.
"""

import statistics
import sys
import time

import numpy as np
import tensorflow as tf

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
x = tf.constant(np.ones(1024, np.float32))


def median_us(fn):
    for _ in range(20):  # warm-up: tracing, first-call allocations
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def dependent_multiplies(k):
    @tf.function
    def run(v):
        for _ in range(k):
            v = v * 1.0001
        return v
    return run


print(f"eager tf.identity, 4 KB: {median_us(lambda: tf.identity(x)):.1f} us")
for k in (1, 20, 100):
    fn = dependent_multiplies(k)
    call = median_us(lambda: fn(x))
    print(f"tf.function of {k:3d} dependent multiplies: {call:7.1f} us a call, "
          f"{call / k:6.1f} us of it per op")
