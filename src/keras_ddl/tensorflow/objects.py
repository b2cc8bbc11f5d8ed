"""Collectives on picklable Python objects: ``broadcast_object`` and
``allgather_object``.

An object is pickled into bytes, carried as a uint8 tensor (its length
first, so the receivers know how much arrives), and unpickled. Call them
on every rank, in the same order (or with the same ``name``); inside a
tf.function they run while it is traced.
Unpickling runs code chosen by the sender: use them between the ranks of
one job only.
"""

import functools
import pickle

import numpy as np
import tensorflow as tf

from ..common import basics, process_sets
from .collectives import allgather, broadcast
from .arguments import _check_root
from .naming import auto_name


def _eagerly(function):
    """Runs the object collective eagerly even while a tf.function traces:
    a Python object exists at trace time only, so it is exchanged then (once
    per trace, in the program order every rank follows) and the traced
    function sees the result as a constant, as Horovod's do in a graph."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        if tf.executing_eagerly():
            return function(*args, **kwargs)
        with tf.init_scope():
            return function(*args, **kwargs)
    return run


def _to_bytes(obj):
    """(uint8 array of the pickled obj, None) or (None, why it failed)."""
    try:
        return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),
                             dtype=np.uint8), None
    except Exception as e:
        return None, f"{type(obj).__name__}: {e}"


# A length of -1 tells the other ranks that this rank could not pickle its
# object, so every rank raises instead of some waiting for bytes that never
# come.
_FAILED = -1


@_eagerly
def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns ``root_rank``'s ``obj`` on every rank (of ``process_set``).

    Args:
        obj: Any picklable object; only the root's is used (others may pass
            None).
        root_rank: The world rank whose object every rank gets (in
            ``process_set``). Defaults to 0.
        name: Prefix of the two collectives' names, or None.
        process_set: A registered ``ProcessSet`` whose ranks alone call it,
            or None (default): every rank.

    Returns:
        An unpickled copy of the root's object (the root gets its own
        ``obj`` back, not a copy).
    """
    _check_root(root_rank)
    base = auto_name(name, "broadcast_object", process_sets.set_id(process_set, "broadcast_object"))
    is_root = basics.rank() == root_rank
    payload, why = _to_bytes(obj) if is_root else (np.zeros([0], np.uint8), None)
    mine = _FAILED if payload is None else payload.size
    length = int(broadcast(tf.constant([mine], tf.int64), root_rank, name=base + ".length",
                           process_set=process_set).numpy()[0])
    if length == _FAILED:
        raise TypeError(f"keras_ddl: broadcast_object: root rank {root_rank} cannot pickle "
                        f"its object ({why or 'see its error'}); raised on rank {basics.rank()}")
    if not is_root:
        payload = np.zeros([length], np.uint8)
    data = broadcast(tf.constant(payload), root_rank, name=base + ".bytes",
                     process_set=process_set)
    return obj if is_root else pickle.loads(data.numpy().tobytes())


@_eagerly
def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's ``obj`` (of ``process_set``), in rank order.

    Args:
        obj: Any picklable object.
        name: Prefix of the two collectives' names, or None.
        process_set: A registered ``ProcessSet`` whose ranks alone call it,
            or None (default): every rank.

    Returns:
        A list of ``size()`` objects, or of the set's size (unpickled
        copies, this rank's too).
    """
    base = auto_name(name, "allgather_object",
                     process_sets.set_id(process_set, "allgather_object"))
    payload, why = _to_bytes(obj)
    mine = _FAILED if payload is None else payload.size
    lengths = allgather(tf.constant([mine], tf.int64), name=base + ".lengths",
                        process_set=process_set).numpy()
    ranks = list(range(basics.size())) if process_set is None else process_set.ranks
    failed = [ranks[i] for i, n in enumerate(lengths) if n == _FAILED]
    if failed:
        raise TypeError(f"keras_ddl: allgather_object: rank(s) {failed} cannot pickle their "
                        f"object{' (' + why + ')' if why else ''}; raised on rank {basics.rank()}")
    data = allgather(tf.constant(payload), name=base + ".bytes", process_set=process_set).numpy()
    ends = np.cumsum(lengths)
    return [pickle.loads(data[end - n:end].tobytes()) for n, end in zip(lengths, ends)]
