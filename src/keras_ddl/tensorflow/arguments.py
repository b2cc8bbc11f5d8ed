"""The arguments of the collective ops: reduction ops, the dtypes the ops
take, and the checks and conversions every wrapper applies to its inputs.

Only what a rank can judge alone is checked here; whatever must agree
between ranks (shapes, an op against a dtype, a root rank's range, splits'
sums) is checked in the engine's negotiation, which raises on every rank.
"""

import enum
import numbers

import tensorflow as tf

from ..common import basics
from ..common.validation import check_rank_argument


class ReduceOp(enum.IntEnum):
    """Reduction of ``allreduce``/``reducescatter`` (values are the op attr)."""
    Sum = 0
    Average = 1
    Min = 2
    Max = 3
    Product = 4


Sum = ReduceOp.Sum
Average = ReduceOp.Average
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

# Dtypes the ops take directly (reductions included; on bool Sum and Max
# are logical or, Min and Product logical and).
SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64,
                    tf.int32, tf.int64, tf.uint8, tf.int8, tf.int16, tf.uint16, tf.bool)

# Dtypes that broadcast, allgather and alltoall carry as a supported dtype
# of the same width: they only move bytes, so the bits arrive unchanged.
# Reductions stay on SUPPORTED_DTYPES: a sum of reinterpreted bits would be
# wrong.
CARRIED_AS = {tf.uint32: tf.int32, tf.uint64: tf.int64}
MOVABLE_DTYPES = SUPPORTED_DTYPES + tuple(CARRIED_AS)
# For the per-call checks: a set lookup hashes the dtype once, where the
# tuple compared it with each entry in Python (microseconds per call).
_SUPPORTED_SET = frozenset(SUPPORTED_DTYPES)


def _check_tensor(tensor, argument, op=None):
    if tensor.dtype not in _SUPPORTED_SET:
        raise TypeError(
            f"keras_ddl: {argument} has dtype {tensor.dtype.name}, which is not supported "
            f"(supported: {', '.join(d.name for d in SUPPORTED_DTYPES)}) on rank {basics.rank()}")
    if op is not None:
        # Only the value is checked here. Whether the op suits the dtype
        # (Average of integers) is checked in negotiation, so a rank whose
        # dtype differs from the others' fails together with them instead
        # of alone while they wait.
        if type(op) is not ReduceOp:
            ReduceOp(op)


def _to_wire(tensor):
    """(tensor as it travels, its own dtype to restore, or None)."""
    wire = CARRIED_AS.get(tensor.dtype)
    if wire is None:
        return tensor, None
    return tf.bitcast(tensor, wire), tensor.dtype


def _from_wire(tensor, dtype):
    if dtype is None:
        return tensor
    return tf.bitcast(tensor, dtype)


def densify(slices, argument):
    """``slices`` (a tf.IndexedSlices) as a dense tensor; a clear error, naming
    ``argument`` and the rank, when it has no ``dense_shape`` to densify to."""
    if slices.dense_shape is None:
        raise ValueError(
            f"keras_ddl: {argument} is a tf.IndexedSlices without dense_shape (on rank "
            f"{basics.rank()}), so it cannot be made dense; give it a dense_shape, or reduce it "
            "as slices (sparse_as_dense=False)")
    return tf.convert_to_tensor(slices)


def _to_tensor(value, argument):
    if isinstance(value, tf.Tensor):
        return value
    if isinstance(value, tf.IndexedSlices):
        value = densify(value, argument)
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"keras_ddl: {argument} must be a tensor or convertible to one, "
                        f"got {type(value).__name__}: {e}") from None


def _check_factor(factor, argument):
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
        raise TypeError(f"keras_ddl: {argument} must be a number, got {factor!r} "
                        f"on rank {basics.rank()}")
    return float(factor)


def _splits_input(splits):
    # Its length and sum are checked in negotiation, where every rank gets
    # the error; only what cannot be a row count at all is refused here.
    if splits is None:
        return tf.zeros([0], tf.int64)
    if isinstance(splits, tf.Tensor) or hasattr(splits, "dtype"):
        value = tf.convert_to_tensor(splits)
    else:
        try:
            value = tf.convert_to_tensor(splits, dtype_hint=tf.int64)
        except (TypeError, ValueError) as e:
            raise TypeError(f"keras_ddl: splits must be a 1-D integer tensor or list, got "
                            f"{splits!r}: {e} (rank {basics.rank()})") from None
    if value.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"keras_ddl: splits must have dtype int32 or int64, got "
                        f"{value.dtype.name} (rank {basics.rank()})")
    return tf.cast(value, tf.int64)


def _check_root(root_rank):
    # Its range is checked in negotiation, where every rank gets the error.
    check_rank_argument(root_rank)
