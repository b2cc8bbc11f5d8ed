"""Gradients of the collective ops, registered with TensorFlow on import.

Each gradient is itself a collective, named after its forward collective
(``op_naming._grad_name_input``), so every rank pairs the same ones.
"""

import tensorflow as tf

from ..common import process_sets
from .arguments import Average, ReduceOp, Sum
from .library import op_library
from .naming import _grad_name_input


@tf.RegisterGradient("DdlAllreduce")
def _allreduce_grad(op, grad):
    reduce_op = ReduceOp(op.get_attr("reduce_op"))
    if reduce_op not in (Sum, Average):
        raise LookupError(f"keras_ddl: allreduce with op={reduce_op.name} has no gradient")
    ps = op.get_attr("process_set")
    return [op_library().ddl_allreduce(grad, _grad_name_input(op, "grad", ps),
                                       reduce_op=int(reduce_op), process_set=ps,
                                       wire_dtype=op.get_attr("wire_dtype")), None]


@tf.RegisterGradient("DdlGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    reduce_op = ReduceOp(op.get_attr("reduce_op"))
    if reduce_op not in (Sum, Average):
        raise LookupError(f"keras_ddl: grouped_allreduce with op={reduce_op.name} has no gradient")
    grads = [tf.zeros_like(x) if g is None else g for g, x in zip(grads, op.inputs[:-1])]
    ps = op.get_attr("process_set")
    reduced = op_library().ddl_grouped_allreduce(
        grads, _grad_name_input(op, "grad", ps), reduce_op=int(reduce_op),
        wire_dtype=op.get_attr("wire_dtype"), process_set=ps)
    return list(reduced) + [None]


@tf.RegisterGradient("DdlAllgather")
def _allgather_grad(op, grad):
    # d(sum of every rank's loss)/d(my rows) = the sum over ranks of the
    # gradient rows that came from this rank.
    x = op.inputs[0]
    ps = op.get_attr("process_set")
    me = process_sets.rank_in(ps)
    summed = op_library().ddl_allreduce(grad, _grad_name_input(op, "grad", ps),
                                        reduce_op=int(Sum), process_set=ps)
    if x.shape.rank == 0:
        return [summed[me], None]
    rows = op_library().ddl_allgather(tf.shape(x, out_type=tf.int64)[:1],
                                      _grad_name_input(op, "grad.rows", ps),
                                      process_set=ps)
    # A mask, not rows[:me]: on rank 0 that slice is empty and constant, and
    # a graph optimiser could then drop this collective on rank 0 alone.
    before = tf.cast(tf.range(tf.size(rows, out_type=tf.int64)) < me, tf.int64)
    offset = tf.reduce_sum(rows * before)
    return [tf.slice(summed, tf.concat([[offset], tf.zeros([tf.rank(x) - 1], tf.int64)], 0),
                     tf.shape(x, out_type=tf.int64)), None]


@tf.RegisterGradient("DdlBroadcast")
def _broadcast_grad(op, grad):
    root = op.get_attr("root_rank")  # the set's index of the root
    ps = op.get_attr("process_set")
    summed = op_library().ddl_allreduce(grad, _grad_name_input(op, "grad", ps),
                                        reduce_op=int(Sum), process_set=ps)
    if process_sets.rank_in(ps) == root:
        return [summed, None]
    # Non-roots discard the sum but must still take part in it. The zeros are
    # computed from it (multiply_no_nan gives 0 even for inf/nan) so no graph
    # optimiser can prune the collective here while the root waits for it;
    # a control dependency alone does not survive constant folding. The zero
    # sits behind a PlaceholderWithDefault: TensorFlow 2.16's constant
    # folding rewrites a product by a known zero (zeros_like of a static
    # shape) into a constant, which dropped the collective on non-roots.
    zero = tf.raw_ops.PlaceholderWithDefault(input=tf.zeros([], summed.dtype), shape=[])
    return [tf.math.multiply_no_nan(summed, zero), None]


@tf.RegisterGradient("DdlAlltoall")
def _alltoall_grad(op, grad, _received_splits_grad):
    # Row i of my output came from some rank's input; sending the output's
    # gradient back along the same routes (received_splits as the splits)
    # returns every row's gradient to the rank and place it came from.
    ps = op.get_attr("process_set")
    back, _ = op_library().ddl_alltoall(grad, tf.cast(op.outputs[1], tf.int64),
                                        _grad_name_input(op, "grad", ps),
                                        process_set=ps)
    return [back, None, None]


@tf.RegisterGradient("DdlReducescatter")
def _reducescatter_grad(op, grad):
    reduce_op = ReduceOp(op.get_attr("reduce_op"))
    if reduce_op not in (Sum, Average):
        raise LookupError(f"keras_ddl: reducescatter with op={reduce_op.name} has no gradient")
    ps = op.get_attr("process_set")
    gathered = op_library().ddl_allgather(grad, _grad_name_input(op, "grad", ps),
                                          process_set=ps)
    if reduce_op == Average:
        gathered = gathered / tf.cast(process_sets.size_of(ps), gathered.dtype)
    return [gathered, None]
