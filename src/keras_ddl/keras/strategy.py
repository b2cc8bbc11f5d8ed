"""DDLStrategy: a ``tf.distribute.Strategy`` with one replica per process.

    strategy = ddl.DDLStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer, loss, metrics=[...])
    model.fit(dataset)              # under mpiexec -n N, or alone

Every process is one replica; ``num_replicas_in_sync == ddl.size()``. Keras 3
scales each replica's loss by ``1 / num_replicas_in_sync`` and asks the
replica context to SUM the gradients; here that sum goes through keras_ddl's
allreduce (by default one op per gradient, which starts as soon as backprop
has produced it: ``keras_ddl.keras.gradient_overlap``), so N ranks with per-rank
batch B train like one process with batch N*B. See docs/strategy.md for the
user-facing contract.

This module holds most of keras_ddl's private TensorFlow (and Keras) API
use; ``private_api.py`` lists every private touchpoint of the package. They
were tested with the versions in ``TESTED_TENSORFLOW`` and ``TESTED_KERAS``;
any other version gets a warning when a strategy is made. What is private
here, and why:

* ``OneDeviceExtended`` is the base of the extended object: one local device,
  local variables, local updates. The collectives are added on top.
* ``input_util`` builds TensorFlow's ``DistributedDataset`` when the
  replica computes on an accelerator (prefetch to the device). On the CPU the
  datasets are handed over as plain ``tf.data.Dataset`` objects.
* ``trackable.CheckpointInitialValue`` is unwrapped before the broadcast of
  an initial value restored from a checkpoint.
* ``keras.callbacks.CallbackList.__init__`` is wrapped so that printing and
  file-writing callbacks run on rank 0 only (``rank_zero_callbacks``).

How the replicas stay identical:

* Variables created under ``scope()`` take rank 0's initial value (a
  broadcast wraps the initial value), whatever each rank's seed.
* Trainable variables are updated by the optimizer from all-reduced
  gradients, so every rank computes the same update. Under ``mixed_float16``
  the gradients are summed before Keras' loss-scale optimizer checks them
  (``keras_ddl.keras.loss_scale``), so every rank skips the same steps.
* Metric variables (``synchronization=ON_READ``): an update made inside
  ``strategy.run`` is all-reduced as it happens (the deltas are summed for
  ``aggregation=SUM``), so every rank holds the global state and every
  ``result()`` -- per step, per epoch, in ``evaluate`` -- is the global value.
* Other non-trainable floating variables assigned inside ``strategy.run``
  (BatchNormalization's moving statistics) get the mean over ranks of the
  assigned value, like ``MirroredStrategy``'s MEAN aggregation: assigned
  locally when the layer runs, then averaged together in one grouped
  allreduce at the end of the replica step (``_average_step_assignments``).
"""

import contextlib
import itertools
import re
import threading
import warnings
import weakref

import numpy as np
import tensorflow as tf

from ..common import basics
from . import loss_scale
from ..tensorflow import arguments, collectives
from ..tensorflow.compression import Compression
from .gradient_overlap import check_overlap_args, reduce_tensors

# The versions docs/versions.md's matrix passed (every DDLStrategy smoke test).
TESTED_TENSORFLOW = ("2.16", "2.17", "2.18", "2.19", "2.20", "2.21")
TESTED_KERAS = ("3.15",)

try:  # private TensorFlow modules: everything below depends on them
    from tensorflow.python.distribute import input_util as _input_util
    from tensorflow.python.distribute import one_device_strategy as _one_device
    from tensorflow.python.trackable import base as _trackable
    _ExtendedBase = _one_device.OneDeviceExtended
    _PRIVATE_IMPORT_ERROR = None
except ImportError as _error:  # an untested TensorFlow reorganised its modules
    _input_util = _one_device = _trackable = None
    _ExtendedBase = object
    _PRIVATE_IMPORT_ERROR = _error

_SUM = tf.distribute.ReduceOp.SUM
_MEAN = tf.distribute.ReduceOp.MEAN
# Bool reduces (logical or / and) but has no MEAN: the strategy leaves it alone.
_REDUCIBLE = frozenset(arguments.SUPPORTED_DTYPES) - {tf.bool}
# Dtypes the broadcast op does not take, moved as same-width supported ones.
_MOVABLE = frozenset(arguments.MOVABLE_DTYPES)

_variable_numbers = itertools.count()
_presummed = threading.local()  # see _DDLExtended.gradients_already_summed
_warned = set()
_warn_lock = threading.Lock()


def _warn_once(key, message, category=UserWarning):
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, category, stacklevel=3)


def _minor(version):
    return ".".join(version.split(".")[:2])


def _check_versions():
    import keras
    for package, version, tested in (("TensorFlow", tf.__version__, TESTED_TENSORFLOW),
                                     ("Keras", keras.__version__, TESTED_KERAS)):
        if _minor(version) not in tested:
            _warn_once(
                ("version", package),
                f"keras_ddl.DDLStrategy relies on private {package} internals and was tested "
                f"with {package} {', '.join(t + '.x' for t in tested)} only; {package} "
                f"{version} is installed. Training may fail or silently diverge between "
                "ranks: check results against a single-process run before relying on it.",
                RuntimeWarning)


def _default_device():
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return f"/device:GPU:{basics.local_rank() % len(gpus)}"
    return "/device:CPU:0"


# --- collectives used by the strategy ---------------------------------------

def _reduce_op(reduce_op):
    if isinstance(reduce_op, str):
        reduce_op = tf.distribute.ReduceOp(reduce_op.upper())
    if reduce_op not in (_SUM, _MEAN):
        raise ValueError(f"keras_ddl: DDLStrategy reduces with SUM or MEAN, got {reduce_op!r}")
    return reduce_op


def _as_tensor(value):
    if isinstance(value, tf.IndexedSlices):
        return value
    if isinstance(value, tf.Variable):
        return value.read_value()
    return tf.convert_to_tensor(value)


def _allreduce_all(values, reduce_op, overlap=False, bucket_bytes=None,
                   compression=Compression.none):
    """All-reduces a list of tensors across ranks.

    Floating tensors go in one grouped allreduce (one negotiation, fused), or,
    with ``overlap``, one allreduce each (or one per bucket of
    ``bucket_bytes``), so that inside a graph each starts as soon as its
    input exists (gradients overlap the backward pass; the engine still fuses
    those that are ready in the same cycle). ``compression`` applies to the
    floating tensors. Unnamed: in a graph each op is named after its traced
    function and place in it, eagerly the call order.
    """
    reduce_op = _reduce_op(reduce_op)
    values = [_as_tensor(v) for v in values]
    if basics.size() == 1 or not values:
        return values
    out = [None] * len(values)
    floats, ints = [], []
    for i, v in enumerate(values):
        if isinstance(v, tf.IndexedSlices):
            op = arguments.Average if reduce_op == _MEAN else arguments.Sum
            out[i] = collectives.allreduce(v, op=op)
        elif v.dtype.is_floating:
            floats.append(i)
        elif v.dtype in _REDUCIBLE:
            ints.append(i)
        else:
            raise TypeError(f"keras_ddl: DDLStrategy cannot reduce a {v.dtype.name} tensor "
                            f"across ranks (supported: float and integer tensors)")
    if floats:
        op = arguments.Average if reduce_op == _MEAN else arguments.Sum
        if len(floats) == 1:
            out[floats[0]] = collectives.allreduce(values[floats[0]], op=op,
                                               compression=compression)
        else:
            reduced = reduce_tensors([values[i] for i in floats], op, overlap=overlap,
                                     bucket_bytes=bucket_bytes, compression=compression)
            for i, r in zip(floats, reduced):
                out[i] = r
    if ints:
        summed = collectives.grouped_allreduce([values[i] for i in ints], op=arguments.Sum)
        for i, r in zip(ints, summed):
            # MEAN of integers: true division, as tf.distribute does
            out[i] = r / basics.size() if reduce_op == _MEAN else r
    return out


def _broadcast_any(value, name):
    """Rank 0's ``value`` on every rank, for any dtype a variable can have."""
    dtype = value.dtype
    if dtype in _MOVABLE:
        return collectives.broadcast(value, 0, name=name)
    _warn_once(("broadcast", dtype.name),
               f"keras_ddl: variables of dtype {dtype.name} are not broadcast from rank 0 "
               "(no wire format); make sure every rank initialises them identically.")
    return value


def _gather_along(value, axis):
    value = tf.convert_to_tensor(value)
    if basics.size() == 1:
        return value
    axis = tf.get_static_value(axis)
    if axis is None:
        raise ValueError("keras_ddl: DDLStrategy.gather needs a constant axis")
    axis = int(axis)
    rank = value.shape.rank
    if rank is None or rank == 0:
        raise ValueError("keras_ddl: gather needs a tensor of known rank >= 1")
    axis = axis % rank
    if axis == 0:
        return collectives.allgather(value)
    perm = [axis] + [d for d in range(rank) if d != axis]
    gathered = collectives.allgather(tf.transpose(value, perm))
    return tf.transpose(gathered, np.argsort(perm).tolist())


# --- variables kept identical across ranks ------------------------------------

class _SyncedVariableMixin:
    """Makes replica-context updates of a variable global (see module doc).

    Set on variables created under a DDLStrategy in a world of more than one
    process. Outside ``strategy.run`` (eager code, optimizer updates in the
    cross-replica update context, ``reset_state``) assignments stay local:
    every rank makes them identically. (No ``__slots__``: the class of an
    existing variable is switched to a subclass, whose layout must match.)
    """

    def _ddl_global(self, value, kind):
        mode = getattr(self, "_ddl_sync", None)
        if mode is None or not isinstance(tf.distribute.get_replica_context(),
                                          _DDLReplicaContext):
            return None
        value = tf.convert_to_tensor(value, dtype=self.dtype)
        # Unnamed: in a graph the op takes its node name, eagerly the call order.
        if mode == "sum":
            if kind == "assign":  # the deltas from the common old value add up
                old = self.read_value()
                return old + collectives.allreduce(value - old, op=arguments.Sum)
            return collectives.allreduce(value, op=arguments.Sum)
        if mode == "step_mean":
            step = getattr(_step_means, "pending", None)
            if step is not None and kind == "assign":
                step.setdefault(id(self), self)  # averaged once, after the replica step
                return None
            mode = "mean"
        if mode == "mean":
            return collectives.allreduce(value, op=arguments.Average)
        return _broadcast_any(value, None)  # "first": rank 0's value

    def assign(self, value, use_locking=None, name=None, read_value=True):
        synced = self._ddl_global(value, "assign")
        return super().assign(value if synced is None else synced, use_locking, name, read_value)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        synced = self._ddl_global(delta, "add")
        return super().assign_add(delta if synced is None else synced, use_locking, name,
                                  read_value)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        synced = self._ddl_global(delta, "sub")
        return super().assign_sub(delta if synced is None else synced, use_locking, name,
                                  read_value)


_synced_classes = {}
# Variables of "step_mean" mode assigned in the running replica step (see
# _average_step_assignments); None outside a step.
_step_means = threading.local()


def _average_step_assignments(pending):
    """Replaces each variable in ``pending`` by its mean over ranks, in one
    grouped allreduce.

    A "step_mean" variable assigned inside the replica step (BatchNormalization's
    moving statistics: some hundred small tensors per step in a ResNet) is
    assigned locally when the layer runs and averaged here, once, instead of
    one allreduce per assignment in the forward pass. The result is the same
    as averaging each assignment -- bitwise, for one assignment per step of
    a value computed from the (identical) old value -- and the allreduce
    starts as soon as the last of these assignments has run, overlapping
    the rest of the step.
    """
    if not pending:
        return
    variables = list(pending.values())  # traced in program order: the same on every rank
    averaged = collectives.grouped_allreduce([v.read_value() for v in variables],
                                         op=arguments.Average)
    for variable, value in zip(variables, averaged):
        super(_SyncedVariableMixin, variable).assign(value)


def _sync_mode(variable, optimizer_slot):
    """How replica-context updates of ``variable`` are combined, or None."""
    dtype = tf.as_dtype(variable.dtype)
    aggregation = variable.aggregation
    if variable.synchronization == tf.VariableSynchronization.ON_READ:
        if dtype not in _REDUCIBLE or aggregation == tf.VariableAggregation.NONE:
            return None
        if aggregation == tf.VariableAggregation.MEAN:
            return "mean" if dtype.is_floating else None
        if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
            return "first"
        return "sum"
    # Trainable variables and optimizer slots change in the cross-replica
    # update context from all-reduced gradients; integer state (step
    # counters, seeds) advances identically everywhere.
    if variable.trainable or optimizer_slot or not dtype.is_floating:
        return None
    if aggregation == tf.VariableAggregation.SUM:
        return "sum"
    if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
        return "first"
    # NONE or MEAN: BatchNormalization's moving statistics. Assigned values
    # are averaged at the end of the step (_average_step_assignments); an
    # ON_READ "mean" variable may be read inside the step, so it is not.
    return "step_mean"


def _make_synced(variable, optimizer_slot):
    mode = _sync_mode(variable, optimizer_slot)
    if mode is None or not isinstance(variable, tf.Variable):
        return variable
    base = type(variable)
    cls = _synced_classes.get(base)
    if cls is None:
        cls = type("DDLSynced" + base.__name__, (_SyncedVariableMixin, base), {})
        _synced_classes[base] = cls
    try:
        variable.__class__ = cls
    except TypeError:  # a variable class whose layout does not allow it
        _warn_once(("sync", base.__name__),
                   f"keras_ddl: cannot keep {base.__name__} variables synchronised across "
                   "ranks; their replica-context updates stay local.")
        return variable
    variable._ddl_sync = mode
    return variable


def _broadcast_initial_value(initial_value, dtype, name):
    number = next(_variable_numbers)
    label = re.sub(r"[^A-Za-z0-9_.\-/]", "_", str(name or "variable"))
    wire_name = f"DDLStrategy.variable.{number}.{label}"

    def value_from_rank_zero(value):
        if isinstance(value, _trackable.CheckpointInitialValue):
            value = value.wrapped_value  # restored value: the same file everywhere
        value = tf.convert_to_tensor(value, dtype=dtype)
        return _broadcast_any(value, wire_name)

    if callable(initial_value):
        return lambda: value_from_rank_zero(initial_value())
    if isinstance(initial_value, tf.Tensor) and not tf.executing_eagerly() and \
            getattr(initial_value, "graph", None) is not None:
        return value_from_rank_zero(initial_value)  # a graph tensor stays in its graph
    return lambda: value_from_rank_zero(initial_value)


# --- datasets -------------------------------------------------------------------

def _rows_of_rank(n, index, count):
    """[start, start + size) of rank ``index`` when n rows split over count ranks."""
    base = n // count
    extra = n % count
    start = index * base + tf.minimum(tf.cast(index, n.dtype), extra)
    size = base + tf.cast(index < extra, n.dtype)
    return start, size


def shard_global_batches(dataset, index=None, count=None):
    """Rank ``index``'s rows of every (global) batch of ``dataset``.

    Every rank iterates the whole dataset and keeps its contiguous slice of
    each batch, split as evenly as possible (the first ``rows % count`` ranks
    get one more row). Every rank therefore makes the same number of steps,
    and the union of the slices is exactly the global batch.
    """
    index = basics.rank() if index is None else int(index)
    count = basics.size() if count is None else int(count)
    spec = dataset.element_spec
    for s in tf.nest.flatten(spec):
        shape = getattr(s, "shape", None)
        if shape is not None and shape.rank == 0:
            raise ValueError(
                "keras_ddl: DDLStrategy splits every batch of a dataset across ranks, but "
                f"this dataset has unbatched (scalar) components: {spec}. Batch it with the "
                "global batch size, or set its auto_shard_policy to OFF to give every rank "
                "its own already-sharded, per-replica-batched dataset (docs/strategy.md).")

    def take(x):
        if isinstance(x, tf.SparseTensor):
            start, size = _rows_of_rank(x.dense_shape[0], index, count)
            rest = tf.zeros_like(x.dense_shape[1:])
            return tf.sparse.slice(x, tf.concat([[start], rest], 0),
                                   tf.concat([[size], x.dense_shape[1:]], 0))
        if isinstance(x, tf.RaggedTensor):
            start, size = _rows_of_rank(x.nrows(), index, count)
            return x[start:start + size]
        start, size = _rows_of_rank(tf.shape(x, out_type=tf.int64)[0], index, count)
        return x[start:start + size]

    unpack = type(spec) is tuple  # tf.data passes a plain tuple as positional args

    def slice_element(*args):
        element = args if unpack else args[0]
        return tf.nest.map_structure(take, element)

    return dataset.map(slice_element)


# Datasets this module already made into one rank's share: distributing one
# again (fit does, for what experimental_distribute_dataset returned) must
# not split it again.
_rank_shares = weakref.WeakSet()


def _already_sharded(dataset):
    _rank_shares.add(dataset)
    return dataset


def _auto_shard_policy(dataset):
    try:
        return dataset.options().experimental_distribute.auto_shard_policy
    except AttributeError:
        return tf.data.experimental.AutoShardPolicy.AUTO


# --- the strategy -----------------------------------------------------------------

class _DDLReplicaContext(tf.distribute.ReplicaContext):
    """The replica context of this process: replica id = rank."""

    def __init__(self, strategy):
        super().__init__(strategy, replica_id_in_sync_group=basics.rank())

    @property
    def devices(self):
        return self._strategy.extended.worker_devices


class _DDLExtended(_ExtendedBase):
    """One local device per process; reductions go across processes."""

    # DistributedOptimizer and DistributedGradientTape refuse to reduce the
    # gradients again under a strategy that says this.
    sums_gradients_across_ranks = True

    def __init__(self, container_strategy, device, overlap_gradients, bucket_bytes,
                 compression=Compression.none):
        super().__init__(container_strategy, device)
        self._rank = basics.rank()
        self._size = basics.size()
        self._overlap = overlap_gradients
        self._bucket_bytes = bucket_bytes
        self._compression = compression

    # variables

    def _create_variable(self, next_creator, **kwargs):
        optimizer_slot = kwargs.get("colocate_with") is not None
        if self._size > 1:
            kwargs["initial_value"] = _broadcast_initial_value(
                kwargs["initial_value"], kwargs.get("dtype"), kwargs.get("name"))
        variable = super()._create_variable(next_creator, **kwargs)
        if self._size > 1:
            variable = _make_synced(variable, optimizer_slot)
        return variable

    # running replica functions

    def _call_for_each_replica(self, fn, args, kwargs):
        outer = getattr(_step_means, "pending", None)
        _step_means.pending = {} if self._size > 1 else None
        try:
            with tf.device(self._device), _DDLReplicaContext(self._container_strategy()):
                result = fn(*args, **kwargs)
                _average_step_assignments(_step_means.pending)
        finally:
            _step_means.pending = outer
        return result

    def _get_local_replica_id(self, replica_id_in_sync_group):
        return 0  # the one replica this process holds

    # reductions

    def _reduce_to(self, reduce_op, value, destinations, options):
        del destinations, options
        return _allreduce_all([value], reduce_op)[0]

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        # ReplicaContext.all_reduce lands here: Keras' gradient sum
        del options
        values = [v for v, _ in value_destination_pairs]
        if getattr(_presummed, "depth", 0):
            return [_as_tensor(v) for v in values]
        return _allreduce_all(values, reduce_op, overlap=self._overlap,
                              bucket_bytes=self._bucket_bytes, compression=self._compression)

    def sum_gradients(self, grads):
        """Sums ``grads`` (``None`` entries stay) across ranks now, in the
        layout of the gradient sum: called in the replica context by a
        loss-scale optimizer before its finiteness check."""
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        summed = _allreduce_all([grads[i] for i in present], _SUM, overlap=self._overlap,
                                bucket_bytes=self._bucket_bytes,
                                compression=self._compression)
        for i, s in zip(present, summed):
            grads[i] = s
        return grads

    def reduce_ahead_of_loss_scale(self, grads, trainable_variables):
        """The gradients summed across ranks, and the block in which the
        optimizer takes them as summed: the protocol ``loss_scale`` uses so
        that every rank's finiteness check sees the same gradients."""
        del trainable_variables
        return self.sum_gradients(grads), self.gradients_already_summed()

    @staticmethod
    @contextlib.contextmanager
    def gradients_already_summed():
        """Replica-context ``all_reduce`` calls (the optimizer's gradient
        sum) made while tracing or running the block return their inputs:
        ``sum_gradients`` has summed them already."""
        _presummed.depth = getattr(_presummed, "depth", 0) + 1
        try:
            yield
        finally:
            _presummed.depth -= 1

    def _gather_to_implementation(self, value, destinations, axis, options):
        del destinations, options
        return _gather_along(value, axis)

    # input

    @property
    def _on_host(self):
        return tf.DeviceSpec.from_string(self._device).device_type in (None, "CPU")

    def _experimental_distribute_dataset(self, dataset, options):
        if options is not None and options.experimental_replication_mode == \
                tf.distribute.InputReplicationMode.PER_REPLICA:
            raise NotImplementedError(
                "keras_ddl: InputReplicationMode.PER_REPLICA is only supported by "
                "distribute_datasets_from_function")
        if self._size > 1 and dataset not in _rank_shares and _auto_shard_policy(dataset) != \
                tf.data.experimental.AutoShardPolicy.OFF:
            if _auto_shard_policy(dataset) == tf.data.experimental.AutoShardPolicy.FILE:
                _warn_once("file-policy",
                           "keras_ddl: AutoShardPolicy.FILE is not implemented by DDLStrategy; "
                           "every rank reads the whole dataset and keeps its slice of each "
                           "batch (DATA). Shard files yourself with "
                           "distribute_datasets_from_function for large pipelines.")
            dataset = _already_sharded(shard_global_batches(dataset, self._rank, self._size))
        return self._distributed(dataset, options)

    def _distributed(self, dataset, options):
        if self._on_host:
            # The replica computes where the input already is: hand over the
            # plain dataset, which fit and custom loops iterate as is.
            # (TensorFlow's DistributedDataset would build a multi-device
            # iterator: ~1 s of tracing at every epoch.)
            return dataset
        return _input_util.get_distributed_dataset(
            dataset, self._input_workers_with_options(options), self._container_strategy(),
            options=options)

    def _input_context(self):
        return tf.distribute.InputContext(num_input_pipelines=self._size,
                                          input_pipeline_id=self._rank,
                                          num_replicas_in_sync=self._size)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        if options is not None and options.experimental_replication_mode == \
                tf.distribute.InputReplicationMode.PER_REPLICA:
            raise NotImplementedError(
                "keras_ddl: InputReplicationMode.PER_REPLICA is not supported (one replica "
                "per process: PER_WORKER is the same thing)")
        if self._on_host:
            with tf.device(self._input_device):
                dataset = dataset_fn(self._input_context())
            return _already_sharded(dataset) if self._size > 1 else dataset
        return _input_util.get_distributed_datasets_from_function(
            dataset_fn, self._input_workers_with_options(options), [self._input_context()],
            self._container_strategy(), options=options)

    def _experimental_distribute_values_from_function(self, value_fn):
        return value_fn(tf.distribute.experimental.ValueContext(
            replica_id_in_sync_group=self._rank, num_replicas_in_sync=self._size))

    # what the rest of tf.distribute asks

    @property
    def _num_replicas_in_sync(self):
        return self._size

    @property
    def should_checkpoint(self):
        return self._rank == 0

    @property
    def should_save_summary(self):
        return self._rank == 0

    def _in_multi_worker_mode(self):
        # False keeps values plain tensors (no PerReplica wrapping, which is
        # what breaks MultiWorkerMirroredStrategy inside Keras 3's fit).
        return False


class DDLStrategy(tf.distribute.Strategy):
    """Synchronous data parallelism over keras_ddl's MPI collectives.

    One replica per process: ``num_replicas_in_sync == ddl.size()`` and the
    replica id is the rank. Use it like any ``tf.distribute.Strategy``::

        strategy = ddl.DDLStrategy()
        with strategy.scope():
            model = build_model()
            model.compile(...)
        model.fit(dataset)   # dataset batched with the GLOBAL batch size

    Args:
      device: the device this process computes on. Default: GPU
        ``local_rank() % num_gpus`` when GPUs are visible, else the CPU.
      rank_zero_callbacks: when True (default), Keras' progress bar and the
        ``ModelCheckpoint``, ``TensorBoard`` and ``CSVLogger`` callbacks of a
        model built under this strategy run on rank 0 only; every other
        callback runs on every rank.
      overlap_gradients: True (default) issues one allreduce per gradient
        (or per bucket, see ``bucket_mb``), each starting as soon as backprop
        has produced that gradient, so communication overlaps the rest of
        the backward pass (the engine fuses the gradients that are ready in
        the same cycle). False sums all gradients of a step in one grouped
        allreduce after the backward pass (one negotiation, one fused
        transfer). Bitwise the same results either way.
      bucket_mb: None (default): one allreduce per gradient. A positive
        number: gradients go in buckets of at most this many MB, filled from
        the last layer to the first, one grouped allreduce per bucket (which
        starts when its last gradient exists). Needs ``overlap_gradients``.
      compression: ``ddl.Compression.none`` (default), ``.fp16`` or ``.bf16``:
        floating gradients travel in that 16-bit type and are cast back
        (halves the bytes on the wire; the sum is rounded to 16 bits).
    """

    def __init__(self, device=None, rank_zero_callbacks=True, overlap_gradients=True,
                 bucket_mb=None, compression=Compression.none):
        if _PRIVATE_IMPORT_ERROR is not None:
            raise ImportError(
                f"keras_ddl.DDLStrategy needs TensorFlow internals missing from TensorFlow "
                f"{tf.__version__} (tested: {', '.join(TESTED_TENSORFLOW)}): "
                f"{_PRIVATE_IMPORT_ERROR}")
        _check_versions()
        overlap, bucket_bytes = check_overlap_args(overlap_gradients, bucket_mb, "DDLStrategy")
        if not isinstance(compression, Compression._Cast):
            raise ValueError("keras_ddl: DDLStrategy(compression=...) must be "
                             "ddl.Compression.none, .fp16 or .bf16, got " + repr(compression))
        basics.init()
        super().__init__(_DDLExtended(self, device or _default_device(), overlap, bucket_bytes,
                                      compression))
        loss_scale.install()  # mixed_float16: ranks agree on skipping a step
        self.rank_zero_callbacks = bool(rank_zero_callbacks)
        if self.rank_zero_callbacks:
            _install_callback_filter()

    @property
    def rank(self):
        return self.extended._rank

    @property
    def size(self):
        return self.extended._size

    def __repr__(self):
        return f"DDLStrategy(rank={self.rank}, size={self.size}, device={self.extended._device!r})"


# --- rank-0-only side effects of Keras callbacks -----------------------------------

_filter_installed = False
_filter_lock = threading.Lock()


def _rank_zero_only_types():
    import keras
    return (keras.callbacks.ProgbarLogger, keras.callbacks.ModelCheckpoint,
            keras.callbacks.TensorBoard, keras.callbacks.CSVLogger)


def _install_callback_filter():
    """Wraps ``CallbackList.__init__`` to drop rank-0-only callbacks elsewhere."""
    global _filter_installed
    with _filter_lock:
        if _filter_installed:
            return
        import keras
        callback_list = keras.callbacks.CallbackList
        original_init = callback_list.__init__

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            model = kwargs.get("model", args[3] if len(args) > 3 else None)
            strategy = getattr(model, "_distribute_strategy", None)
            if (isinstance(strategy, DDLStrategy) and strategy.rank_zero_callbacks
                    and strategy.rank != 0):
                dropped = _rank_zero_only_types()
                self.callbacks = [c for c in self.callbacks if not isinstance(c, dropped)]
                self._progbar = None

        __init__.__wrapped__ = original_init
        callback_list.__init__ = __init__
        _filter_installed = True


# --- predictions ---------------------------------------------------------------------

def _gather_rows(array):
    array = np.asarray(array)
    if basics.size() == 1:
        return array, [len(array)]
    counts = collectives.allgather(tf.constant([len(array)], tf.int64)).numpy().tolist()
    return collectives.allgather(tf.constant(array)).numpy(), counts


def _global_order(counts, batch_size):
    """Indices that reorder rank-ordered rows into the dataset's order."""
    size = len(counts)
    total = sum(counts)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    taken = [0] * size
    order = []
    remaining = total
    while remaining > 0:
        rows = min(batch_size, remaining)
        base, extra = divmod(rows, size)
        for r in range(size):
            n = base + (1 if r < extra else 0)
            order.append(np.arange(offsets[r] + taken[r], offsets[r] + taken[r] + n))
            taken[r] += n
        remaining -= rows
    if taken != list(counts):
        raise ValueError(
            f"keras_ddl.gather_predictions: per-rank row counts {list(counts)} do not come "
            f"from splitting batches of {batch_size} rows across {size} ranks; pass the "
            "global batch size given to predict (or batch_size=None to concatenate in rank "
            "order)")
    return np.concatenate(order) if order else np.zeros([0], np.int64)


def gather_predictions(outputs, batch_size=None):
    """Every rank's ``model.predict`` outputs, on every rank, in dataset order.

    Under DDLStrategy, ``predict`` returns only this rank's rows: its slice
    of every global batch. Call this on every rank (it is a collective) with
    the global ``batch_size`` the data was batched with to get the full
    predictions in the original order; with ``batch_size=None`` the rows are
    concatenated in rank order (right when each rank predicted its own,
    already-sharded data).
    """
    leaves = tf.nest.flatten(outputs)
    gathered = []
    for leaf in leaves:
        rows, counts = _gather_rows(leaf)
        if batch_size is not None and basics.size() > 1:
            rows = rows[_global_order(counts, int(batch_size))]
        gathered.append(rows)
    return tf.nest.pack_sequence_as(outputs, gathered)
