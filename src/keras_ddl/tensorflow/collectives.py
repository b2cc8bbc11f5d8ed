"""Collective operations on TensorFlow tensors.

Thin wrappers over the C++ ops in ``ddl_tf_ops.so``; each op enqueues its
tensor in the background engine and completes when every rank has offered
a collective of the same name. Their gradients are registered by
``gradients`` (imported here), so the ops work inside
``tf.GradientTape`` and ``tf.function``.
"""

import tensorflow as tf

from . import private_api
from ..common import basics, process_sets
from . import gradients  # noqa: F401  (registers the ops' gradients)
from .compression import Compression
from .arguments import (Average, ReduceOp, Sum, _check_factor, _check_root, _check_tensor,
                           _from_wire, _splits_input, _to_tensor, _to_wire)
from .library import op_library
from .naming import _name_input, auto_name


# The public ops are plain Python around their op calls: AutoGraph has
# nothing to convert in them, yet inside a user's tf.function it would
# re-read and convert their source at every trace (and the public
# do_not_convert costs a wrapper per eager call).
_not_converted = private_api.skip_autograph


def scale(tensor, factor):
    """``tensor * factor`` (``factor`` a Python float). Floating tensors are
    multiplied in their dtype; integer tensors in float64, then truncated
    back to their dtype. A factor of 1 adds no op."""
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating:
        return tensor * tf.cast(factor, tensor.dtype)
    return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


@_not_converted
def allreduce(tensor, op=Average, name=None, compression=Compression.none,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Reduces ``tensor`` over all ranks; every rank gets the same result.

    Results are bitwise identical on every rank. ``Average`` divides the sum
    by ``size()`` and is an error for integer dtypes. A ``tf.IndexedSlices``
    is reduced by gathering its values and indices (``Sum``/``Average`` only).

    Args:
        tensor: The tensor (or tf.IndexedSlices) to reduce.
        op: ``Sum``, ``Average`` (default), ``Min``, ``Max`` or ``Product``.
        name: Name of the collective (the same on every rank), or None.
        compression: ``Compression.none`` (default), ``.fp16`` or ``.bf16``.
        prescale_factor: Multiplies ``tensor`` before the reduction.
        postscale_factor: Multiplies the result after the reduction. Both
            are part of the gradient: it is ``allreduce(grad, op)`` scaled by
            both factors.
    """
    prescale_factor = _check_factor(prescale_factor, "prescale_factor")
    postscale_factor = _check_factor(postscale_factor, "postscale_factor")
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_indexed_slices(tensor, op, name, "tensor", prescale_factor,
                                         postscale_factor, process_set)
    tensor = _to_tensor(tensor, "tensor")
    _check_tensor(tensor, "tensor", op)
    wire, original = compression.compress(scale(tensor, prescale_factor))
    ps = process_sets.set_id(process_set, "allreduce")
    out = op_library().ddl_allreduce(wire, _name_input(name, "allreduce", set_id=ps),
                                     reduce_op=int(op), process_set=ps,
                                     wire_dtype=compression.engine_wire(tensor),
                                     eager=tf.executing_eagerly())
    return scale(compression.decompress(out, original), postscale_factor)


def _allreduce_indexed_slices(slices, op, name, argument, prescale_factor=1.0,
                              postscale_factor=1.0, process_set=None):
    # Sparse gradients (embeddings) are gathered, not densified: the sum of
    # IndexedSlices is the concatenation of their rows.
    op = ReduceOp(op)
    if op not in (Sum, Average):
        raise ValueError(f"keras_ddl: op={op.name} is not defined for IndexedSlices "
                         f"({argument}, rank {basics.rank()}); use Sum or Average")
    if op == Average and not slices.values.dtype.is_floating:
        raise TypeError(f"keras_ddl: op=Average of the integer IndexedSlices {argument} "
                        f"(dtype {slices.values.dtype.name}, rank {basics.rank()}) would "
                        "not be exact; use Sum")
    base = auto_name(name, "allreduce_slices", process_sets.set_id(process_set, "allreduce"))
    values = allgather(scale(slices.values, prescale_factor), name=base + ".values",
                       process_set=process_set)
    indices = allgather(slices.indices, name=base + ".indices", process_set=process_set)
    if op == Average:
        values = values / tf.cast(process_sets.set_size(process_set), values.dtype)
    return tf.IndexedSlices(scale(values, postscale_factor), indices,
                            dense_shape=slices.dense_shape)


@_not_converted
def grouped_allreduce(tensors, op=Average, name=None, compression=Compression.none,
                      prescale_factor=1.0, postscale_factor=1.0, sparse_as_dense=False,
                      process_set=None):
    """Allreduces a list of tensors in one negotiation and fused transfers.

    Args:
        tensors: A list of tensors; ``tf.IndexedSlices`` among them are
            reduced by gathering their values and indices (as ``allreduce``
            does), or densified first with ``sparse_as_dense=True``.
        op, name, compression, prescale_factor, postscale_factor: as for
            ``allreduce``.
        sparse_as_dense: Densify ``tf.IndexedSlices`` (they need a
            ``dense_shape``) and reduce them with the dense tensors.

    Returns:
        A list of the results, in the order of ``tensors``.
    """
    prescale_factor = _check_factor(prescale_factor, "prescale_factor")
    postscale_factor = _check_factor(postscale_factor, "postscale_factor")
    tensors = list(tensors)
    if not tensors:
        return []
    sparse = [i for i, t in enumerate(tensors)
              if isinstance(t, tf.IndexedSlices) and not sparse_as_dense]
    ps = process_sets.set_id(process_set, "grouped_allreduce")
    if sparse:
        base = auto_name(name, "grouped_allreduce", ps)
        out = [None] * len(tensors)
        for i in sparse:
            out[i] = _allreduce_indexed_slices(tensors[i], op, f"{base}.slices{i}",
                                               f"tensors[{i}]", prescale_factor,
                                               postscale_factor, process_set)
        dense = [i for i in range(len(tensors)) if i not in sparse]
        reduced = grouped_allreduce([tensors[i] for i in dense], op, base, compression,
                                    prescale_factor, postscale_factor, process_set=process_set)
        for i, r in zip(dense, reduced):
            out[i] = r
        return out
    tensors = [_to_tensor(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    wires, originals = [], []
    for i, t in enumerate(tensors):
        _check_tensor(t, f"tensors[{i}]", op)
        wire, original = compression.compress(scale(t, prescale_factor))
        wires.append(wire)
        originals.append(original)
    # One attribute for the op: it applies to the float32 members only.
    engine_wire = max(compression.engine_wire(t) for t in tensors)
    outs = op_library().ddl_grouped_allreduce(
        wires, _name_input(name, "grouped_allreduce", set_id=ps), reduce_op=int(op),
        wire_dtype=engine_wire, process_set=ps, eager=tf.executing_eagerly())
    return [scale(compression.decompress(o, orig), postscale_factor)
            for o, orig in zip(outs, originals)]


@_not_converted
def allgather(tensor, name=None, process_set=None):
    """Concatenates every rank's ``tensor`` along axis 0 (in rank order).

    The first dimension may differ between ranks; the others must match.
    A scalar is gathered as a vector of ``size()`` elements.
    """
    tensor, dtype = _to_wire(_to_tensor(tensor, "tensor"))
    _check_tensor(tensor, "tensor")
    ps = process_sets.set_id(process_set, "allgather")
    return _from_wire(op_library().ddl_allgather(
        tensor, _name_input(name, "allgather", dtype, ps), process_set=ps), dtype)


@_not_converted
def broadcast(tensor, root_rank=0, name=None, process_set=None):
    """Returns ``root_rank``'s ``tensor`` on every rank."""
    tensor, dtype = _to_wire(_to_tensor(tensor, "tensor"))
    _check_tensor(tensor, "tensor")
    _check_root(root_rank)
    ps = process_sets.set_id(process_set, "broadcast")
    root = process_sets.root_in_set(root_rank, process_set, "broadcast")
    return _from_wire(op_library().ddl_broadcast(tensor, _name_input(name, "broadcast", dtype, ps),
                                                 root_rank=int(root), process_set=ps), dtype)


@_not_converted
def reducescatter(tensor, op=Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=None):
    """Reduces over ranks and returns this rank's block of rows of axis 0.

    Rows are split as evenly as possible: the first ``rows % size`` ranks
    get one more row than the others. ``prescale_factor`` multiplies the
    input, ``postscale_factor`` the result (both enter the gradient).
    """
    prescale_factor = _check_factor(prescale_factor, "prescale_factor")
    postscale_factor = _check_factor(postscale_factor, "postscale_factor")
    tensor = _to_tensor(tensor, "tensor")
    _check_tensor(tensor, "tensor", op)
    ps = process_sets.set_id(process_set, "reducescatter")
    out = op_library().ddl_reducescatter(scale(tensor, prescale_factor),
                                         _name_input(name, "reducescatter", set_id=ps),
                                         reduce_op=int(op), process_set=ps)
    return scale(out, postscale_factor)


@_not_converted
def alltoall(tensor, splits=None, name=None, process_set=None):
    """Sends rows of axis 0 to every rank and gathers the rows every rank
    sends to this one, as Horovod's ``alltoall``.

    ``splits``: how many rows go to each rank, in rank order (a 1-D int32 or
    int64 tensor or list of ``size()`` entries summing to
    ``tensor.shape[0]``; zeros allowed). Without it the rows are split
    evenly, which needs ``tensor.shape[0]`` divisible by ``size()``. The
    other dimensions must match on every rank.

    Returns, as Horovod does, ``(output, received_splits)`` when ``splits``
    is given and ``output`` alone when it is not: the received rows
    concatenated in rank order, and an int32 vector of how many came from
    each rank.
    """
    tensor, dtype = _to_wire(_to_tensor(tensor, "tensor"))
    _check_tensor(tensor, "tensor")
    ps = process_sets.set_id(process_set, "alltoall")
    out, received = op_library().ddl_alltoall(tensor, _splits_input(splits),
                                              _name_input(name, "alltoall", dtype, ps),
                                              process_set=ps)
    out = _from_wire(out, dtype)
    return out if splits is None else (out, received)


@_not_converted
def barrier(name=None, process_set=None):
    """Returns once every rank has called ``barrier``."""
    ps = process_sets.set_id(process_set, "barrier")
    op_library().ddl_barrier(_name_input(name, "barrier", set_id=ps), process_set=ps)


@_not_converted
def join():
    """Waits until every rank has called ``join``, taking part meanwhile in
    the collectives the other ranks still run.

    A rank that runs out of data calls ``join``. Until the last rank does,
    its background engine stands in for it in every collective of the
    global process set that the other ranks run, with zeros for its tensor:
    a Sum adds nothing, an Average divides by the ranks that have not
    joined, an allgather gets no rows from it, a broadcast is received and
    dropped. Min, Max and Product see the zeros. A broadcast whose root has
    joined, and an alltoall while any rank has joined, fail on every rank
    that runs them. Then every rank's ``join`` returns.

    Returns:
        The rank that joined last (the highest one if several joined in
        the same negotiation cycle): a Python int when called eagerly, an
        int32 scalar tensor inside a ``tf.function``.

    Raises:
        tf.errors.InvalidArgumentError if this rank's earlier ``join`` has
        not returned; the engine's error if a rank dies meanwhile.
    """
    last = op_library().ddl_join()
    return int(last) if tf.executing_eagerly() else last


@_not_converted
def grouped_allgather(tensors, name=None):
    """``allgather`` of each tensor of a list; returns the list of results.

    Member ``i`` is the collective ``"<name>.<i>"`` (the name is generated
    once for the group when None), so every rank pairs the same members;
    inside ``tf.function`` the engine fuses the members ready together.
    """
    base = auto_name(name, "grouped_allgather")
    return [allgather(t, name=f"{base}.{i}") for i, t in enumerate(tensors)]


@_not_converted
def grouped_reducescatter(tensors, op=Sum, name=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    """``reducescatter`` of each tensor of a list; returns the list of results.

    Args:
        tensors: A list of tensors (each split along its axis 0).
        op: ``Sum`` (default, as ``reducescatter``), ``Average``, ``Min``,
            ``Max`` or ``Product``.
        name: Prefix of the members' names (``"<name>.<i>"``), or None.
        prescale_factor, postscale_factor: as for ``reducescatter``.
    """
    base = auto_name(name, "grouped_reducescatter")
    return [reducescatter(t, op=op, name=f"{base}.{i}", prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor) for i, t in enumerate(tensors)]


def _int_op(value, name, default):
    return tf.constant(value, dtype=tf.int32, name=name or default)


def rank_op(name=None):
    """``rank()`` as an int32 tensor (usable inside ``tf.function``; the
    world does not change after ``init``, so it is a constant)."""
    return _int_op(basics.rank(), name, "ddl_rank")


def size_op(name=None):
    """``size()`` as an int32 tensor (see ``rank_op``)."""
    return _int_op(basics.size(), name, "ddl_size")


def local_rank_op(name=None):
    """``local_rank()`` as an int32 tensor (see ``rank_op``)."""
    return _int_op(basics.local_rank(), name, "ddl_local_rank")


def local_size_op(name=None):
    """``local_size()`` as an int32 tensor (see ``rank_op``)."""
    return _int_op(basics.local_size(), name, "ddl_local_size")
