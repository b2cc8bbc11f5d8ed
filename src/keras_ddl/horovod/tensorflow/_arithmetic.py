"""What Horovod computes, where keras_ddl's own API computes otherwise.

Horovod hands `prescale_factor` / `postscale_factor` to its op as float32
attributes and scales in the engine: integers in float64 and truncated
back, float16 in float32, other floats in float64 and rounded back. `Average`
is a Sum whose postscale is divided by the set's size, so it is defined for
integers too (truncated, not refused as keras_ddl's own API does).
IndexedSlices take Sum and Average only, without factors; their Average
divides with `/`, so integer values come back floating.

One difference, on purpose: a compressed (16-bit wire) floating Average
with factors stays an Average in the engine, which divides each value by
the ranks before the wire, with the factors applied around it
(`postscale * Average(prescale * x)`): the same value up to rounding,
where Horovod's float16 Sum of large values overflows to inf.
"""

import numpy as np
import tensorflow as tf

import keras_ddl as ddl
from keras_ddl.common import basics, process_sets
from keras_ddl.tensorflow.arguments import Average, Sum
from keras_ddl.tensorflow.naming import auto_name


def as_attr(factor, argument):
    """`factor` as Horovod's float32 op attribute sees it (a Python float)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float, np.number)):
        raise TypeError(f"keras_ddl.horovod: {argument} must be a number, got {factor!r} "
                        f"(rank {basics.rank()})")
    return float(np.float32(factor))


def scale(tensor, factor):
    """`tensor * factor` as Horovod's CPU engine scales a buffer."""
    if factor == 1.0 or tensor.dtype == tf.bool:
        return tensor
    dtype = tensor.dtype
    if dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(tensor, tf.float32) * factor, dtype)
    if dtype == tf.float64:
        return tensor * tf.constant(factor, tf.float64)
    # float32 and integers: the product in float64, then rounded or truncated.
    return tf.cast(tf.cast(tensor, tf.float64) * factor, dtype)


def _needs_scaling(dtypes, op, prescale, postscale):
    # bool is not an integer here: its Average stays refused by the engine.
    integer_average = op == Average and any(d.is_integer for d in dtypes)
    return prescale != 1.0 or postscale != 1.0 or integer_average


def _average_in_engine(dtypes, op, compression):
    """A compressed Average of floating tensors runs as the engine's Average
    (see the module docstring), not as a Sum on the 16-bit wire."""
    return (op == Average and compression is not ddl.Compression.none
            and all(d.is_floating for d in dtypes))


def _postscale(op, postscale, process_set):
    return postscale / process_sets.set_size(process_set) if op == Average else postscale


def allreduce_dense(tensor, op, name, compression, prescale, postscale, process_set):
    """Horovod's dense allreduce of one tensor (see the module docstring)."""
    if not _needs_scaling([tensor.dtype], op, prescale, postscale):
        return ddl.allreduce(tensor, op=op, name=name, compression=compression,
                             process_set=process_set)
    if _average_in_engine([tensor.dtype], op, compression):
        reduced = ddl.allreduce(scale(tensor, prescale), op=Average, name=name,
                                compression=compression, process_set=process_set)
        return scale(reduced, postscale)
    reduced = ddl.allreduce(scale(tensor, prescale), op=Sum if op == Average else op, name=name,
                            compression=compression, process_set=process_set)
    return scale(reduced, _postscale(op, postscale, process_set))


def grouped_allreduce_dense(tensors, op, name, compression, prescale, postscale, process_set):
    """Horovod's grouped allreduce of dense tensors."""
    if not _needs_scaling([t.dtype for t in tensors], op, prescale, postscale):
        return ddl.grouped_allreduce(tensors, op=op, name=name, compression=compression,
                                     process_set=process_set)
    engine_average = _average_in_engine([t.dtype for t in tensors], op, compression)
    reduced = ddl.grouped_allreduce([scale(t, prescale) for t in tensors],
                                    op=Sum if op == Average and not engine_average else op,
                                    name=name, compression=compression, process_set=process_set)
    post = postscale if engine_average else _postscale(op, postscale, process_set)
    return [scale(r, post) for r in reduced]


def reducescatter(tensor, op, name, prescale, postscale, process_set):
    """Horovod's reducescatter, integer Average included."""
    if not _needs_scaling([tensor.dtype], op, prescale, postscale):
        return ddl.reducescatter(tensor, op=op, name=name, process_set=process_set)
    out = ddl.reducescatter(scale(tensor, prescale), op=Sum if op == Average else op, name=name,
                            process_set=process_set)
    return scale(out, _postscale(op, postscale, process_set))


def check_slices(op, prescale, postscale, argument, function):
    """Horovod's refusals for a tf.IndexedSlices, naming the argument and the rank."""
    if op not in (Sum, Average):
        raise NotImplementedError(
            f"keras_ddl.horovod: {function}(op={op.name}): only Sum and Average ops are "
            f"supported with tf.IndexedSlices ({argument}, rank {basics.rank()})")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError(
            f"keras_ddl.horovod: {function}(prescale_factor={prescale!r}, postscale_factor="
            f"{postscale!r}): pre/postscale factors are not supported with tf.IndexedSlices "
            f"({argument}, rank {basics.rank()})")


def allreduce_slices(slices, op, name, process_set):
    """Gathers the values and indices; Average divides the values with `/`."""
    base = auto_name(name, "allreduce_slices", process_sets.set_id(process_set, "allreduce"))
    values = ddl.allgather(slices.values, name=base + ".values", process_set=process_set)
    indices = ddl.allgather(slices.indices, name=base + ".indices", process_set=process_set)
    if op == Average:
        values = values / tf.cast(process_sets.set_size(process_set), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)
