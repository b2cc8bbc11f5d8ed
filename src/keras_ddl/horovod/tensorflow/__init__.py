"""`horovod.tensorflow`'s API over keras_ddl.

    import keras_ddl.horovod.tensorflow as hvd     # was: import horovod.tensorflow as hvd

Names, argument names, order and defaults follow Horovod 0.28. `device_*`
and `ignore_name_scope` are accepted and ignored (keras_ddl runs its
collectives on the CPU and does not scope names); `session` must be None,
and `op` not Adasum (NotImplementedError otherwise). `process_set` is a set
registered by `init(process_sets=...)` or `add_process_set`; only its ranks
call its collectives, and `root_rank` is a world rank (`rank()`) in it, as
in Horovod.
"""

import tensorflow as tf

import keras_ddl as ddl
from keras_ddl.common.basics import (cross_rank, cross_size, is_initialized, local_rank,  # noqa: F401
                              local_size, rank, shutdown, size)
from keras_ddl.common import process_sets as _process_sets
from keras_ddl.tensorflow.arguments import Average, Max, Min, Product, Sum  # noqa: F401
from keras_ddl.tensorflow.naming import auto_name as _auto_name
from keras_ddl.keras.sync_batch_norm import SyncBatchNormalization  # noqa: F401

from ..common import (Adasum, ProcessSet, add_process_set, alltoall,  # noqa: F401
                      ccl_built, check_compression, check_process_set, check_session,
                      cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set, init,
                      is_homogeneous, join, mpi_built, mpi_enabled, mpi_threads_supported,
                      nccl_built, reduce_op, refuse_elastic, remove_process_set, rocm_built,
                      start_timeline, stop_timeline)
from ..common import set_by_id as _set_by_id
from . import _arithmetic, _gradients
from .compression import (Compression, Compressor, FP16Compressor,  # noqa: F401
                          NoneCompressor, engine_compression)


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduces a tensor (or tf.IndexedSlices) over all ranks (or `process_set`'s),
    computing what Horovod computes (see `_arithmetic`): integer Average is
    defined (truncated), factors are float32 and scale integers in float64.

    Args:
        tensor: The tensor, variable or tf.IndexedSlices to reduce.
        average: Deprecated: True is op=Average, False op=Sum.
        device_dense, device_sparse: Ignored.
        compression: Compression.none, .fp16, or a Compressor subclass.
        op: Average (default), Sum, Min, Max or Product (IndexedSlices:
            Sum or Average, NotImplementedError otherwise).
        prescale_factor, postscale_factor: Multiply before / after the
            reduction (not with IndexedSlices: NotImplementedError).
        name: Name of the collective (the same on every rank), or None.
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
        ignore_name_scope: Ignored.
    """
    process_set = check_process_set(process_set, "allreduce")
    op = reduce_op(op, average, "allreduce")
    pre = _arithmetic.as_attr(prescale_factor, "prescale_factor")
    post = _arithmetic.as_attr(postscale_factor, "postscale_factor")
    if isinstance(tensor, tf.IndexedSlices):
        _arithmetic.check_slices(op, pre, post, "tensor", "allreduce")
        return _arithmetic.allreduce_slices(tensor, op, name, process_set)
    wire, compressor = engine_compression(compression, "allreduce")
    tensor, ctx = _compress(compressor, tf.convert_to_tensor(tensor))
    out = _arithmetic.allreduce_dense(tensor, op, name, wire, pre, post, process_set)
    return compressor.decompress(out, ctx) if compressor is not None else out


def _compress(compressor, tensor):
    return (tensor, None) if compressor is None else compressor.compress(tensor)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Reduces a list of tensors in one group (tf.IndexedSlices among them
    are gathered, as Horovod does).

    Args: as `allreduce`, with `tensors` a list.
    """
    process_set = check_process_set(process_set, "grouped_allreduce")
    op = reduce_op(op, average, "grouped_allreduce")
    pre = _arithmetic.as_attr(prescale_factor, "prescale_factor")
    post = _arithmetic.as_attr(postscale_factor, "postscale_factor")
    tensors = list(tensors)
    if not tensors:
        return tensors
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    out = [None] * len(tensors)
    if sparse:
        for i in sparse:
            _arithmetic.check_slices(op, pre, post, f"tensors[{i}]", "grouped_allreduce")
        name = _group_name(name, "grouped_allreduce", process_set)
        for i in sparse:
            out[i] = _arithmetic.allreduce_slices(tensors[i], op, f"{name}.slices{i}",
                                                  process_set)
    dense = [i for i in range(len(tensors)) if i not in sparse]
    if dense:
        wire, compressor = engine_compression(compression, "grouped_allreduce")
        packed = [_compress(compressor, tf.convert_to_tensor(tensors[i])) for i in dense]
        reduced = _arithmetic.grouped_allreduce_dense([t for t, _ in packed], op, name, wire,
                                                      pre, post, process_set)
        for i, r, (_, ctx) in zip(dense, reduced, packed):
            out[i] = compressor.decompress(r, ctx) if compressor is not None else r
    return out


def _compressed_reducescatter(tensor, compression, op, name, prescale_factor, postscale_factor,
                              process_set, function):
    """Horovod's order: compress, reduce-scatter (with the factors), decompress."""
    wire, compressor = engine_compression(compression, function)
    tensor = tf.convert_to_tensor(tensor)
    if compressor is None and wire.wire_dtype is not None:
        compressor = FP16Compressor if wire.wire_dtype == tf.float16 else _Bf16Cast
    tensor, ctx = _compress(compressor, tensor)
    out = _gradients.reducescatter(tensor, op, name,
                                   _arithmetic.as_attr(prescale_factor, "prescale_factor"),
                                   _arithmetic.as_attr(postscale_factor, "postscale_factor"),
                                   process_set)
    return compressor.decompress(out, ctx) if compressor is not None else out


class _Bf16Cast(FP16Compressor):
    """keras_ddl's Compression.bf16 as a Python cast (reducescatter has no wire dtype)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.bfloat16), tensor.dtype
        return tensor, tensor.dtype


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces over ranks (or `process_set`'s) and returns this rank's rows of
    axis 0; integer Average and the factors as Horovod computes them, and
    Horovod's gradient (the gathered gradient, times the set's size for Sum).

    Args:
        tensor: The tensor to reduce and split.
        device_dense, ignore_name_scope: Ignored.
        compression: Compression.none, .fp16 (cast before and after) or a
            Compressor subclass.
        op: Average (default, as Horovod; keras_ddl's own default is Sum),
            Sum, Min, Max or Product.
        name: Name of the collective, or None.
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
        prescale_factor, postscale_factor: Multiply before / after.
    """
    process_set = check_process_set(process_set, "reducescatter")
    return _compressed_reducescatter(tensor, compression, reduce_op(op, None, "reducescatter"),
                                     name, prescale_factor, postscale_factor, process_set,
                                     "reducescatter")


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """`reducescatter` of each tensor of a list, as one named group.

    Args: as `reducescatter`, with `tensors` a list.
    """
    process_set = check_process_set(process_set, "grouped_reducescatter")
    op = reduce_op(op, None, "grouped_reducescatter")
    # Member i is "<base>.<i>", as ddl.grouped_reducescatter names it.
    base = _group_name(None, "grouped_reducescatter", process_set)
    return [_compressed_reducescatter(t, compression, op, f"{base}.{i}", prescale_factor,
                                      postscale_factor, process_set, "grouped_reducescatter")
            for i, t in enumerate(tensors)]


def _group_name(name, kind, process_set):
    """The name of a group of collectives (`name`, or the next unnamed one
    of `process_set`, numbered apart from other sets')."""
    return _auto_name(name, kind, _process_sets.set_id(process_set, kind))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's tensor (or `process_set`'s ranks') along axis
    0; its gradient is Horovod's (this rank's rows of the averaged gradient).

    Args:
        tensor: The tensor (first dimension may differ between ranks).
        name: Name of the collective, or None.
        ignore_name_scope: Ignored.
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
    """
    process_set = check_process_set(process_set, "allgather")
    return _gradients.allgather(tensor, name, process_set)


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """`allgather` of each tensor of a list. Args: as `allgather`."""
    process_set = check_process_set(process_set, "grouped_allgather")
    base = _group_name(name, "grouped_allgather", process_set)
    return [_gradients.allgather(t, f"{base}.{i}", process_set) for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Returns `root_rank`'s tensor on every rank (of `process_set`); its
    gradient is Horovod's (the averaged gradient on the root, zeros elsewhere).

    Args:
        tensor: The tensor (same shape on every rank).
        root_rank: The sending rank: a world rank (`rank()`), in
            `process_set`, as in Horovod.
        name: Name of the collective, or None.
        ignore_name_scope: Ignored.
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
    """
    process_set = check_process_set(process_set, "broadcast")
    return _gradients.broadcast(tensor, root_rank, name, process_set)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Assigns `root_rank`'s values to `variables` in place; returns the new values.

    Args:
        variables: A list of variables.
        root_rank: The sending world rank (in `process_set`).
        name: Prefix of the collectives' names, or None.
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
    """
    process_set = check_process_set(process_set, "broadcast_")
    if process_set is None:
        return ddl.broadcast_(variables, root_rank, name=name)
    variables = list(variables)
    _assign_broadcast(variables, root_rank, _group_name(name, "broadcast_", process_set),
                      process_set)
    return [tf.convert_to_tensor(v) for v in variables]


def _assign_broadcast(variables, root_rank, base, process_set):
    """Assigns `root_rank`'s values to `variables`, one broadcast over
    `process_set` each (named "<base>.<i>")."""
    for i, v in enumerate(variables):
        v.assign(ddl.broadcast(tf.convert_to_tensor(v), root_rank, name=f"{base}.{i}",
                               process_set=process_set))


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns `root_rank`'s values to `variables` (always in place here).

    Args:
        variables: A list of variables.
        root_rank: The sending world rank (in `process_set`).
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
        inplace: Ignored (keras_ddl always assigns in place).
    """
    process_set = check_process_set(process_set, "broadcast_variables")
    if process_set is None:
        ddl.broadcast_variables(variables, root_rank=root_rank)
        return
    _assign_broadcast(list(variables), root_rank,
                      _group_name(None, "broadcast_variables", process_set), process_set)


def broadcast_global_variables(root_rank):
    """Raises RuntimeError: TensorFlow 2 / Keras 3 have no global variables
    (Horovod raises under eager execution too); see the message."""
    return ddl.broadcast_global_variables(root_rank)


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=global_process_set):
    """Returns `root_rank`'s picklable `obj` on every rank (of `process_set`).

    Args:
        obj: The object (only the root's is used).
        root_rank: The sending world rank (in `process_set`).
        session: Must be None (no TF1 sessions).
        name: Prefix of the collectives' names, or None.
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
    """
    check_session(session, "broadcast_object")
    process_set = check_process_set(process_set, "broadcast_object")
    return ddl.broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function `fn(obj)` that calls `broadcast_object` with these arguments."""
    check_session(session, "broadcast_object_fn")
    process_set = check_process_set(process_set, "broadcast_object_fn")
    return lambda obj: ddl.broadcast_object(obj, root_rank=root_rank, name=name,
                                            process_set=process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's (or `process_set`'s ranks') picklable
    `obj`, in rank order.

    Args:
        obj: The object.
        session: Must be None.
        name: Prefix of the collectives' names, or None.
        process_set: The ranks that take part (default: every rank); a
            registered ProcessSet that includes this rank.
    """
    check_session(session, "allgather_object")
    process_set = check_process_set(process_set, "allgather_object")
    return ddl.allgather_object(obj, name=name, process_set=process_set)


def rank_op(name=None):
    """rank() as an int32 tensor."""
    return ddl.rank_op(name)


def local_rank_op(name=None):
    """local_rank() as an int32 tensor."""
    return ddl.local_rank_op(name)


def size_op(process_set_id=0, name=None):
    """The size of the set with `process_set_id` (0, default: size()) as an
    int32 tensor; the set must be registered through this module."""
    if process_set_id == 0:
        return ddl.size_op(name)
    size_of_set = _set_by_id(process_set_id, "size_op").size()
    return tf.constant(size_of_set, tf.int32, name=name or "ddl_process_set_size")


def local_size_op(name=None):
    """local_size() as an int32 tensor."""
    return ddl.local_size_op(name)


def process_set_included_op(process_set_id=0, name=None):
    """1 if this rank is in the set with `process_set_id` (0, default: the
    global set), else 0, as an int32 tensor."""
    included = _set_by_id(process_set_id, "process_set_included_op").included()
    return tf.constant(int(included), tf.int32, name=name)


def check_gradient_args(function, op, gradient_predivide_factor, num_groups, groups,
                        process_set, compression):
    """Validates Horovod's gradient-reduction arguments; returns (op, compression)."""
    if process_set is not None and process_set is not global_process_set:
        raise NotImplementedError(
            f"keras_ddl.horovod: {function}(process_set={process_set!r}): gradients are reduced "
            f"over every rank only (rank {rank()}); reduce a plain tape's gradients with "
            "hvd.grouped_allreduce(grads, process_set=...) instead")
    op = reduce_op(op, None, function)
    if op not in (Average, Sum):
        raise ValueError(f"keras_ddl.horovod: {function}(op={op.name}): gradients are reduced "
                         "with Average or Sum")
    if isinstance(gradient_predivide_factor, bool) or not isinstance(
            gradient_predivide_factor, (int, float)) or not gradient_predivide_factor > 0:
        raise ValueError(f"keras_ddl.horovod: {function}(gradient_predivide_factor="
                         f"{gradient_predivide_factor!r}) must be a number > 0 (rank {rank()})")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError(f"keras_ddl.horovod: {function}(gradient_predivide_factor="
                         f"{gradient_predivide_factor!r}) needs op=Average")
    if num_groups or groups is not None:
        raise NotImplementedError(
            f"keras_ddl.horovod: {function}(num_groups={num_groups!r}, groups=...): explicit "
            "gradient groups are not supported; keras_ddl fuses the gradients ready in each "
            "cycle by itself (see DistributedOptimizer's bucket_mb)")
    return op, check_compression(compression, function)


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wraps a tf.GradientTape so `gradient()` reduces over ranks.

    Args:
        gradtape: The tf.GradientTape.
        device_dense, device_sparse: Ignored.
        compression: Compression.none or .fp16.
        sparse_as_dense: Accepted; sparse gradients are always made dense.
        op: Average (default) or Sum.
        gradient_predivide_factor: With op=Average, divide the gradients by
            it before the sum and the sum by size() / factor after, as
            Horovod does (a float16 sum then overflows less).
        num_groups, groups: Must be 0 / None.
        process_set: Must be the global set (NotImplementedError otherwise:
            gradients are reduced over every rank).
        scale_local_gradients: Divide the gradients of sources registered
            with `register_local_source` by size().
    """
    op, compression = check_gradient_args("DistributedGradientTape", op,
                                          gradient_predivide_factor, num_groups, groups,
                                          process_set, compression)
    return predivide(ddl.DistributedGradientTape(gradtape, op=op, compression=compression,
                                                 scale_local_gradients=scale_local_gradients),
                     gradient_predivide_factor)


def predivide(reducer, gradient_predivide_factor):
    """Makes a keras_ddl optimizer or tape divide the gradients by
    `gradient_predivide_factor` before the sum and the sum by
    size() / factor after, as Horovod does (checked by `check_gradient_args`)."""
    reducer._predivide_factor = float(gradient_predivide_factor)
    return reducer


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """`DistributedGradientTape` that leaves `local_layers`' gradients unreduced.

    Args: as `DistributedGradientTape`, plus `local_layers`: a Keras layer
    or a list of them (built).
    """
    op, compression = check_gradient_args("PartialDistributedGradientTape", op,
                                          gradient_predivide_factor, num_groups, groups,
                                          process_set, compression)
    return predivide(ddl.PartialDistributedGradientTape(
        gradtape, local_layers=local_layers, scale_local_gradients=scale_local_gradients, op=op,
        compression=compression), gradient_predivide_factor)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras optimizer so gradients are reduced over ranks (see
    `keras_ddl.horovod.tensorflow.keras.DistributedOptimizer`; TF1
    `tf.compat.v1.train.Optimizer`s are not supported). `use_locking` is
    ignored."""
    from .keras import DistributedOptimizer as keras_distributed_optimizer
    return keras_distributed_optimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)


def __getattr__(name):
    refuse_elastic(__name__, name)
