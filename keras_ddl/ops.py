"""Collective operations on TensorFlow tensors.

Thin wrappers over the C++ ops in ``ddl_tf_ops.so``; each op enqueues its
tensor in the background engine and completes when every rank has offered
a collective of the same name. Gradients are registered here, so the ops
work inside ``tf.GradientTape`` and ``tf.function``.
"""

import enum
import itertools
import numbers
import threading
import weakref

import tensorflow as tf

from . import _private_api, basics, process_sets
from ._validation import check_rank_argument


# The public ops are plain Python around their op calls: AutoGraph has
# nothing to convert in them, yet inside a user's tf.function it would
# re-read and convert their source at every trace (and the public
# do_not_convert costs a wrapper per eager call).
_not_converted = _private_api.skip_autograph


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

_lib = None
_lib_lock = threading.Lock()
_eager_names = {}  # process set id -> counter of unnamed eager collectives


def op_library():
    """Loads the TensorFlow op library, checking it matches this TensorFlow."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            info = basics.build_info()
            built_for = info.get("tensorflow")
            if built_for != tf.__version__:
                raise ImportError(
                    f"keras_ddl's op library was built for TensorFlow {built_for}, but "
                    f"TensorFlow {tf.__version__} is installed; a custom op library only "
                    "loads into the TensorFlow it was compiled against.\n" + basics.REBUILD_HINT)
            basics.init()  # loads the core first, so the op library links to it
            try:
                _lib = tf.load_op_library(basics.OPS_LIBRARY)
            except (tf.errors.NotFoundError, OSError) as e:
                raise ImportError(
                    f"cannot load {basics.OPS_LIBRARY} (built for TensorFlow {built_for}): "
                    f"{e}\n" + basics.REBUILD_HINT) from e
    return _lib


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


# Per traced graph: (the order in which this process first built a
# collective into it, a counter of its unnamed collectives).
# graph -> {set id: (the graph's number among that set's graphs, counter)}
_graph_names = weakref.WeakKeyDictionary()
_graph_order = {}  # set id -> count of graphs with unnamed collectives of the set


def auto_name(name, kind, set_id=0):
    """``name``, or when it is None the name an unnamed collective of this
    ``kind`` gets here (see ``_name_input``); a string. Each process set
    numbers its own: a rank outside a set makes none of its calls, and its
    numbering of the others must not shift."""
    if name is not None:
        return name
    prefix = f"set{set_id}." if set_id else ""
    if tf.executing_eagerly():
        counter = _eager_names.setdefault(set_id, itertools.count())
        return f"{prefix}{kind}.{next(counter)}"
    # A graph is numbered in each set's own order, when it first names a
    # collective of that set: a function traced only by a set's members
    # must not shift the world's numbering of later graphs.
    per_set = _graph_names.setdefault(tf.compat.v1.get_default_graph(), {})
    entry = per_set.get(set_id)
    if entry is None:
        order = _graph_order.setdefault(set_id, itertools.count())
        entry = per_set[set_id] = (next(order), itertools.count())
    return f"{prefix}graph{entry[0]}.{kind}.{next(entry[1])}"


def _name_input(name, kind, carried=None, set_id=0):
    """The op's tensor_name input.

    ``carried``: the dtype of a tensor that travels as another (CARRIED_AS);
    its name is appended, so a rank sending uint32 and one sending int32
    under one name do not pair silently (the name differs: they stall and
    are reported).

    Eager calls without a name get a process-wide counter (every rank makes
    the same eager calls in the same order). Inside a traced function an
    unnamed collective is named after the graph (numbered in the order
    graphs are traced, as every rank runs the same program) and its place
    in it, so the collectives of two functions (a model's train and test
    steps, a retrace) never share a name: ranks out of step then wait for
    each other and are reported, instead of pairing unrelated tensors.
    """
    name = auto_name(name, kind, set_id)
    if carried is not None:
        name = f"{name}.{carried.name}"
    if not tf.executing_eagerly():
        # Behind a PlaceholderWithDefault the name is no constant, so a
        # collective of constant inputs is never constant-folded: folding
        # would run it while the graph is optimised, one at a time in each
        # rank's graph order (ranks whose graphs differ then wait for each
        # other forever), and only once instead of at every call.
        return tf.raw_ops.PlaceholderWithDefault(input=tf.constant(name, dtype=tf.string),
                                                 shape=[])
    # Eager string tensors are immutable: a named collective called every
    # step reuses its name tensor instead of making one per call.
    tensor = _eager_name_tensors.get(name)
    if tensor is None:
        if len(_eager_name_tensors) >= 4096:  # unnamed calls: each name is new
            _eager_name_tensors.clear()
        tensor = _eager_name_tensors[name] = tf.constant(name, dtype=tf.string)
    return tensor


_eager_name_tensors = {}


# The core's codes for the dtypes it can send a float32 allreduce in
# (DataType in custom_ops/common/types.h).
_WIRE_CODES = {tf.float16: 0, tf.bfloat16: 1}


class Compression:
    """Wire compression for floating tensors: sent in a 16-bit float dtype.

    A float32 allreduce is converted by the core as it packs the fused
    buffer and back as it unpacks it; across nodes the sum is taken in the
    wire dtype, inside a node's shared memory in float32. Other floating
    dtypes are cast before the collective and back after it.
    """

    class _Cast:
        def __init__(self, wire_dtype, label):
            self.wire_dtype = wire_dtype
            self.label = label

        def engine_wire(self, tensor):
            """The op's ``wire_dtype``: the core converts ``tensor`` (-1: it does not)."""
            if self.wire_dtype is not None and tensor.dtype == tf.float32:
                return _WIRE_CODES[self.wire_dtype]
            return -1

        def compress(self, tensor):
            if self.engine_wire(tensor) >= 0:
                return tensor, None
            if tensor.dtype.is_floating and tensor.dtype != self.wire_dtype:
                return tf.cast(tensor, self.wire_dtype), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, original_dtype):
            return tensor if original_dtype is None else tf.cast(tensor, original_dtype)

        def __repr__(self):
            return f"Compression.{self.label}"

    class _NoCompression(_Cast):
        def compress(self, tensor):
            return tensor, None

    none = _NoCompression(None, "none")
    fp16 = _Cast(tf.float16, "fp16")
    bf16 = _Cast(tf.bfloat16, "bf16")


def _check_factor(factor, argument):
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
        raise TypeError(f"keras_ddl: {argument} must be a number, got {factor!r} "
                        f"on rank {basics.rank()}")
    return float(factor)


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


def _check_root(root_rank):
    # Its range is checked in negotiation, where every rank gets the error.
    check_rank_argument(root_rank)


_broadcast_calls = itertools.count()


def broadcast_variables(variables, root_rank=0):
    """Assigns ``root_rank``'s values to ``variables`` on every rank.

    Variables are packed per dtype into one buffer each, so the whole list
    costs one collective per dtype.
    """
    _check_root(root_rank)
    _broadcast_packed(list(variables), root_rank, f"broadcast_variables.{next(_broadcast_calls)}")


def _broadcast_packed(variables, root_rank, prefix):
    by_dtype = {}
    for v in variables:
        by_dtype.setdefault(tf.as_dtype(v.dtype), []).append(v)
    for dtype, group in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
        flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in group], axis=0)
        flat = broadcast(flat, root_rank, name=f"{prefix}.{dtype.name}")
        sizes = [int(tf.size(tf.convert_to_tensor(v))) for v in group]
        for v, part in zip(group, tf.split(flat, sizes)):
            v.assign(tf.reshape(part, tf.shape(tf.convert_to_tensor(v))))


@_not_converted
def broadcast_(variables, root_rank, name=None):
    """In-place broadcast: assigns ``root_rank``'s values to ``variables``.

    Like ``broadcast_variables``, and also usable inside ``tf.function``
    (one broadcast per variable there; eagerly one per dtype).

    Args:
        variables: A list of variables (tf.Variable or keras.Variable).
        root_rank: The rank whose values every rank takes.
        name: Prefix of the collectives' names (the same on every rank), or None.

    Returns:
        The list of the variables' new values.
    """
    variables = list(variables)
    _check_root(root_rank)
    base = auto_name(name, "broadcast_")
    if tf.executing_eagerly():
        _broadcast_packed(variables, root_rank, base)
        return [tf.convert_to_tensor(v) for v in variables]
    return [_assign_and_read(v, broadcast(tf.convert_to_tensor(v), root_rank, name=f"{base}.{i}"))
            for i, v in enumerate(variables)]


def _assign_and_read(variable, value):
    """Assigns ``value`` and returns the variable's value read after it.

    In a graph the read must depend on the assignment explicitly: outside
    tf.function (a TF1-style graph) nothing orders them, and a Keras
    variable's ``assign`` returns no op to depend on, so its TensorFlow
    variable is assigned directly.
    """
    target = variable
    if not isinstance(target, tf.Variable) and isinstance(getattr(target, "value", None),
                                                          tf.Variable):
        target = target.value  # a Keras 3 variable's TensorFlow variable
    assigned = target.assign(value, read_value=False)
    with tf.control_dependencies([assigned] if assigned is not None else []):
        return tf.identity(target.read_value())


def broadcast_global_variables(root_rank):
    """Not available: Keras 3 and TensorFlow 2 have no global variable
    collection to broadcast (Horovod's version also fails under eager
    execution). Always raises RuntimeError naming what to call instead."""
    raise RuntimeError(
        "keras_ddl: broadcast_global_variables() has no global variable collection to "
        f"broadcast in TensorFlow 2 / Keras 3 (root_rank={root_rank!r}, rank {basics.rank()}). "
        "Broadcast the variables themselves: keras_ddl.broadcast_variables(model.variables + "
        "optimizer.variables, root_rank), or pass "
        "keras_ddl.callbacks.BroadcastGlobalVariablesCallback(root_rank) to model.fit.")


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


# Gradients. A gradient's collectives are named after the forward
# collective ("<forward name>.<suffix>"), not by a counter: the order in
# which TensorFlow builds gradients, and which graphs each rank traced
# before, may differ between ranks (rank-dependent shapes), and counted
# names then stop pairing up. Only a forward name that is not a constant
# falls back to the counter.
_grad_names = weakref.WeakKeyDictionary()  # graph -> {name: times used in it}


def _grad_name_input(op, suffix, set_id):
    source = op.inputs[-1]
    if getattr(source, "op", None) is not None and source.op.type == "PlaceholderWithDefault":
        source = source.op.inputs[0]  # the name's constant (see _name_input)
    try:
        forward = tf.get_static_value(source)
    except (TypeError, ValueError):
        forward = None
    if hasattr(forward, "item"):  # a numpy scalar or 0-d array
        forward = forward.item()
    if isinstance(forward, bytes):
        forward = forward.decode()
    if not isinstance(forward, str) or not forward:
        return _name_input(None, suffix, set_id=set_id)
    name = f"{forward}.{suffix}"
    if not tf.executing_eagerly():
        # Two gradients of one collective in one graph would share a name.
        used = _grad_names.setdefault(tf.compat.v1.get_default_graph(), {})
        count = used.get(name, 0)
        used[name] = count + 1
        if count:
            name = f"{name}.{count}"
    return _name_input(name, suffix)


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
    # a control dependency alone does not survive constant folding.
    return [tf.math.multiply_no_nan(summed, tf.zeros_like(summed)), None]


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
