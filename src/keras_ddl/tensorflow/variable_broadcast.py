"""Broadcasting variables: every rank takes ``root_rank``'s values."""

import itertools

import tensorflow as tf

from . import private_api
from ..common import basics
from .collectives import broadcast
from .arguments import _check_root
from .naming import auto_name


# AutoGraph leaves broadcast_ alone, as it does the collectives (see
# collectives.py).
_not_converted = private_api.skip_autograph


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
