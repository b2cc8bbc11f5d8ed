"""The front door's allgather, broadcast and reducescatter, with Horovod's
gradients where they differ from keras_ddl's own:

- allgather: the Average (keras_ddl: the Sum) over ranks of the output's
  gradient, this rank's rows of it;
- broadcast: the Average (keras_ddl: the Sum) over ranks on the root, zeros
  elsewhere;
- reducescatter: the gathered gradient, times the set's size for Sum
  (keras_ddl: divided by it for Average); the factors do not enter it.

The gradients' collectives are named after the forward one ("<name>.grad"),
so they pair up across ranks whatever else each rank traced.
"""

import tensorflow as tf

import keras_ddl as ddl
from keras_ddl.common import process_sets
from keras_ddl.tensorflow.arguments import Average, Sum
from keras_ddl.tensorflow.naming import auto_name

from . import _arithmetic


def _differentiable(tensor):
    return tensor.dtype.is_floating


def _my_rows(summed, x, set_id, name, process_set):
    """This rank's rows of `summed` (every rank's `x` along axis 0)."""
    me = process_sets.rank_in(set_id)
    if x.shape.rank == 0:
        return summed[me]
    rows = ddl.allgather(tf.shape(x, out_type=tf.int64)[:1], name=name, process_set=process_set)
    # A mask, not rows[:me]: on rank 0 that slice is empty and constant, and
    # a graph optimiser could then drop the collective on rank 0 alone.
    before = tf.cast(tf.range(tf.size(rows, out_type=tf.int64)) < me, tf.int64)
    offset = tf.reduce_sum(rows * before)
    start = tf.concat([[offset], tf.zeros([tf.rank(x) - 1], tf.int64)], 0)
    return tf.slice(summed, start, tf.shape(x, out_type=tf.int64))


def allgather(tensor, name, process_set):
    tensor = tf.convert_to_tensor(tensor)
    set_id = process_sets.set_id(process_set, "allgather")
    base = auto_name(name, "allgather", set_id)
    if not _differentiable(tensor):
        return ddl.allgather(tensor, name=base, process_set=process_set)

    @tf.custom_gradient
    def gather(x):
        def grad(dy):
            averaged = ddl.allreduce(dy, op=Average, name=base + ".grad", process_set=process_set)
            return _my_rows(averaged, x, set_id, base + ".grad.rows", process_set)
        return ddl.allgather(x, name=base, process_set=process_set), grad

    return gather(tensor)


def broadcast(tensor, root_rank, name, process_set):
    tensor = tf.convert_to_tensor(tensor)
    base = auto_name(name, "broadcast", process_sets.set_id(process_set, "broadcast"))
    if not _differentiable(tensor):
        return ddl.broadcast(tensor, root_rank=root_rank, name=base, process_set=process_set)

    @tf.custom_gradient
    def bcast(x):
        def grad(dy):
            averaged = ddl.allreduce(dy, op=Average, name=base + ".grad", process_set=process_set)
            if ddl.rank() == root_rank:
                return averaged
            # Computed from the average, so no optimiser drops the collective here.
            return tf.math.multiply_no_nan(averaged, tf.zeros_like(averaged))
        return ddl.broadcast(x, root_rank=root_rank, name=base, process_set=process_set), grad

    return bcast(tensor)


def reducescatter(tensor, op, name, prescale, postscale, process_set):
    tensor = tf.convert_to_tensor(tensor)
    base = auto_name(name, "reducescatter", process_sets.set_id(process_set, "reducescatter"))
    if not _differentiable(tensor):
        return _arithmetic.reducescatter(tensor, op, base, prescale, postscale, process_set)

    @tf.custom_gradient
    def scatter(x):
        def grad(dy):
            if op == Sum:
                dy = dy * tf.cast(process_sets.set_size(process_set), dy.dtype)
            return ddl.allgather(dy, name=base + ".grad", process_set=process_set)
        return _arithmetic.reducescatter(x, op, base, prescale, postscale, process_set), grad

    return scatter(tensor)
