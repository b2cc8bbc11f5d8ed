"""`horovod.tensorflow.keras`'s API over keras_ddl.

    import keras_ddl.horovod.tensorflow.keras as hvd   # was: import horovod.tensorflow.keras as hvd

See `keras_ddl.horovod` for the argument conventions.
"""

import keras
import tensorflow as tf

import keras_ddl as ddl
from keras_ddl.horovod.tensorflow import (  # noqa: F401
    Adasum, Average, Compression, Compressor, FP16Compressor, Max, Min, NoneCompressor, Product,
    ProcessSet, Sum, SyncBatchNormalization, add_process_set, allgather_object, alltoall,
    broadcast_object, broadcast_object_fn, ccl_built, check_gradient_args, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set, init,
    is_homogeneous, is_initialized, join, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, predivide, rank, remove_process_set, rocm_built,
    shutdown, size, start_timeline, stop_timeline)
from keras_ddl.horovod import tensorflow as _tf
from keras_ddl.horovod.common import check_compression, refuse_elastic

from . import callbacks  # noqa: F401,E402


def _optimizer_kwargs(function, name, compression, op, gradient_predivide_factor,
                      backward_passes_per_step, average_aggregated_gradients, num_groups, groups,
                      process_set, scale_local_gradients):
    op, compression = check_gradient_args(function, op, gradient_predivide_factor, num_groups,
                                          groups, process_set, compression)
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step,
                                                                    int) \
            or backward_passes_per_step < 1:
        raise ValueError(f"keras_ddl.horovod: {function}(backward_passes_per_step="
                         f"{backward_passes_per_step!r}) must be an int >= 1")
    return dict(name=name, op=op, compression=compression,
                gradient_accumulation_steps=backward_passes_per_step,
                average_accumulated_gradients=average_aggregated_gradients,
                scale_local_gradients=scale_local_gradients)


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras 3 optimizer so gradients are reduced over ranks
    (a `keras_ddl.DistributedOptimizer`).

    Args:
        optimizer: The Keras 3 optimizer.
        name: Name of the optimizer and its collectives, or None.
        device_dense, device_sparse: Ignored.
        compression: Compression.none or .fp16.
        sparse_as_dense: Accepted; sparse gradients are always made dense.
        gradient_predivide_factor: With op=Average, divide the gradients by
            it before the sum and the sum by size() / factor after (Horovod's
            definition: a float16 sum overflows less).
        op: Average (default) or Sum.
        backward_passes_per_step: Local batches per update (gradients are
            accumulated locally, reduced once per update).
        average_aggregated_gradients: Divide the accumulated gradient by
            backward_passes_per_step (False, as Horovod: their sum).
        num_groups, groups: Must be 0 / None.
        process_set: Must be the global set (NotImplementedError otherwise:
            gradients are reduced over every rank).
        scale_local_gradients: Divide the gradients of local variables by size().
    """
    return predivide(ddl.DistributedOptimizer(optimizer, **_optimizer_kwargs(
        "DistributedOptimizer", name, compression, op, gradient_predivide_factor,
        backward_passes_per_step, average_aggregated_gradients, num_groups, groups,
        process_set, scale_local_gradients)), gradient_predivide_factor)


def PartialDistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """`DistributedOptimizer` that does not reduce the gradients of
    `local_layers` (a built Keras layer or a list of them).

    Args: as `DistributedOptimizer`, plus `local_layers`.
    """
    return predivide(ddl.PartialDistributedOptimizer(optimizer, local_layers=local_layers,
                                                     **_optimizer_kwargs(
        "PartialDistributedOptimizer", name, compression, op, gradient_predivide_factor,
        backward_passes_per_step, average_aggregated_gradients, 0, groups, process_set,
        scale_local_gradients)), gradient_predivide_factor)


def broadcast_global_variables(root_rank):
    """Raises RuntimeError: Keras 3 has no global variables; use
    `callbacks.BroadcastGlobalVariablesCallback(root_rank)` or
    `keras_ddl.broadcast_variables(model.variables, root_rank)`."""
    return ddl.broadcast_global_variables(root_rank)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """Reduces a tensor-compatible value over ranks; returns a tensor
    (as `keras_ddl.horovod.tensorflow.allreduce`).

    Args:
        value: A tensor or anything tf.convert_to_tensor takes.
        name: Name of the collective, or None.
        average: Deprecated: True is op=Average, False op=Sum.
        prescale_factor, postscale_factor: Multiply before / after.
        op: Average (default), Sum, Min, Max or Product.
        compression: Compression.none, .fp16 or a Compressor subclass.
    """
    return _tf.allreduce(tf.convert_to_tensor(value), average=average, compression=compression,
                         op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, name=name)


def allgather(value, name=None):
    """Concatenates every rank's value along axis 0; returns a tensor."""
    return _tf.allgather(tf.convert_to_tensor(value), name=name)


def broadcast(value, root_rank, name=None):
    """Returns `root_rank`'s value on every rank, as a tensor."""
    return _tf.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """Reduces over ranks (Average by default, as Horovod) and returns this
    rank's rows of axis 0."""
    return _tf.reducescatter(tf.convert_to_tensor(value), op=op, name=name)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Loads a saved Keras model; its optimizer is made a DistributedOptimizer.

    A model saved with a keras_ddl DistributedOptimizer loads with it; a
    plain optimizer is wrapped in one (keeping its state).

    Args:
        filepath: Path of the `.keras` file.
        custom_optimizers: Optimizer classes the file needs (added to custom_objects).
        custom_objects: Other custom classes or functions, by name.
        compression: Compression of the wrapping DistributedOptimizer.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.saving.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not isinstance(optimizer, ddl.DistributedOptimizer):
        model.optimizer = ddl.DistributedOptimizer(
            optimizer, compression=check_compression(compression, "load_model"))
    return model


def __getattr__(name):
    refuse_elastic(__name__, name)
