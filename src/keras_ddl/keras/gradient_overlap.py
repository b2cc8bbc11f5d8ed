"""Gradient reduction that overlaps the backward pass.

Used by ``DistributedOptimizer``, ``DistributedGradientTape`` and
``DDLStrategy``. Inside a ``tf.function`` TensorFlow runs each op as soon as
its inputs exist, wherever the op was created in the Python code. An
allreduce whose only input is one gradient therefore starts (enqueues in the
engine) as soon as backprop has produced that gradient, while the gradients
of earlier layers are still being computed; the engine fuses whatever is
ready in the same cycle. One grouped allreduce of every gradient, in
contrast, waits for the last one.

Three layouts, the same numbers: on every rank, whatever the layout and
however the engine fused the tensors, each element is reduced in the same
order, so all layouts give bitwise-identical results.

* ``overlap=False``: one grouped allreduce of all tensors (one negotiation,
  starts after the whole backward pass).
* ``overlap=True, bucket_bytes=None``: one allreduce per tensor (the earliest
  start; the default).
* ``overlap=True, bucket_bytes=b``: grouped allreduces of buckets of at most
  ``b`` bytes (a larger tensor is a bucket of its own), filled from the last
  tensor to the first, the order in which backprop produces the gradients of
  a layer stack. A bucket starts when its last member exists.

Eagerly there is nothing to overlap (the gradients all exist before the
first collective is called, and an eager collective blocks until it is
done), so every layout is one grouped allreduce there.
"""

import numbers

import tensorflow as tf

from ..tensorflow.collectives import allreduce, grouped_allreduce
from ..tensorflow.compression import Compression


def check_overlap_args(overlap_gradients, bucket_mb, owner):
    """Validates the two knobs; returns (overlap, bucket size in bytes or None)."""
    if not isinstance(overlap_gradients, bool):
        raise ValueError(f"keras_ddl: {owner}(overlap_gradients=...) must be True or False, "
                         f"got {overlap_gradients!r}")
    if bucket_mb is None:
        return overlap_gradients, None
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, numbers.Real) or \
            not bucket_mb > 0:
        raise ValueError(f"keras_ddl: {owner}(bucket_mb=...) must be a positive number of MB "
                         f"or None (one allreduce per gradient), got {bucket_mb!r}")
    if not overlap_gradients:
        raise ValueError(f"keras_ddl: {owner}(bucket_mb={bucket_mb!r}) needs "
                         "overlap_gradients=True (with overlap_gradients=False all gradients "
                         "go in one grouped allreduce)")
    return True, max(1, int(float(bucket_mb) * 2**20))


def _nbytes(tensor):
    count = tensor.shape.num_elements()
    return None if count is None else count * tensor.dtype.size


def plan_buckets(tensors, bucket_bytes):
    """Lists of indices into ``tensors``: last tensors first, each list at most
    ``bucket_bytes`` (a tensor larger than that, or of unknown size, alone).

    Depends only on static shapes and dtypes, so every rank makes the same plan.
    """
    buckets, current, filled = [], [], 0
    for i in reversed(range(len(tensors))):
        size = _nbytes(tensors[i])
        if size is None or size >= bucket_bytes:
            if current:
                buckets.append(current)
                current, filled = [], 0
            buckets.append([i])
            continue
        if current and filled + size > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size
    if current:
        buckets.append(current)
    return buckets


def reduce_tensors(tensors, op, overlap=True, bucket_bytes=None,
                   compression=Compression.none, name=None, prescale_factor=1.0,
                   postscale_factor=1.0):
    """All-reduces dense ``tensors`` (a list) in the layout chosen above.

    ``name``: a prefix for the collectives' names (the grouped op takes
    ``name``, tensor ``i`` ``name.i``, bucket ``k`` ``name.bucket.k``; every
    rank must pass the same). With ``name=None`` the ops are unnamed: in a
    graph each takes its node name (unique in the function and the same on
    every rank, which builds the same graph), eagerly the call order.
    ``prescale_factor`` / ``postscale_factor`` multiply every tensor before
    and after the reduction (Horovod's gradient_predivide_factor).
    """
    factors = dict(prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    tensors = list(tensors)
    if not tensors:
        return []
    if not overlap or tf.executing_eagerly():
        return grouped_allreduce(tensors, op=op, name=name, compression=compression, **factors)
    if bucket_bytes is None:
        return [allreduce(t, op=op, compression=compression,
                          name=None if name is None else f"{name}.{i}", **factors)
                for i, t in enumerate(tensors)]
    out = [None] * len(tensors)
    for k, members in enumerate(plan_buckets(tensors, bucket_bytes)):
        reduced = grouped_allreduce([tensors[i] for i in members], op=op,
                                    name=None if name is None else f"{name}.bucket.{k}",
                                    compression=compression, **factors)
        for i, r in zip(members, reduced):
            out[i] = r
    return out
