"""The names that pair up a collective across ranks.

Every collective is a named tensor in the core: ranks offer tensors by name,
and a collective runs once every rank has offered the same name. This module
gives unnamed collectives their names (a counter eagerly; the graph and the
place in it inside a ``tf.function``), turns a name into the op's
``tensor_name`` input, and names the collectives of the gradients after
their forward collective.
"""

import itertools
import weakref

import tensorflow as tf


_eager_names = {}  # process set id -> counter of unnamed eager collectives


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
