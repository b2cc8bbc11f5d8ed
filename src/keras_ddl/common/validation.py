"""Checks of arguments shared by several public entry points, so the same
mistake gets the same exception and message wherever it is made.

Only what every rank sees the same way is checked here (a type, a range
against the world size). Whatever could differ between ranks (shapes,
dtypes against ops, a root rank given per call) is checked in the engine's
negotiation instead, which raises on every rank at once.
"""

from . import basics


def check_rank_argument(value, argument="root_rank", owner="keras_ddl", in_range=False):
    """Returns ``value`` if it is an int naming a rank.

    Args:
        value: What the caller passed.
        argument: The argument's name, for the message.
        owner: The function or class that took it, for the message.
        in_range: Also require ``0 <= value < size()``. The world size is
            the same on every rank, so this check fails on all of them.

    Raises:
        TypeError: ``value`` is not an int (bool is refused too).
        ValueError: ``in_range`` and ``value`` is not a rank of this job.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"keras_ddl: {owner} {argument} must be an int, got {value!r} "
                        f"on rank {basics.rank()}")
    if in_range and not 0 <= value < basics.size():
        raise ValueError(f"keras_ddl: {owner} {argument} must be in [0, {basics.size()}), "
                         f"got {value} on rank {basics.rank()}")
    return value
