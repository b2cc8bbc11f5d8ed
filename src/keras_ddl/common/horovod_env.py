"""HOROVOD_* settings: each one set is carried over to its DDL_* twin, or
named in a warning, never silently ignored.

A Horovod job brings its environment along (a batch script, a Kubernetes
MPIJob spec): ``HOROVOD_FUSION_THRESHOLD=67108864`` written for Horovod
should still size the fusion buffer here, and a setting keras_ddl has no
twin for (``HOROVOD_GPU_OPERATIONS=NCCL``) must be named, so nobody believes
it took effect. ``ddl.init()`` calls ``apply()`` before the engine reads its
DDL_* variables, and ``warn()`` once it knows the rank: the warning is
printed by rank 0 only (every rank has the same environment under a
launcher, so one copy says it all).

A DDL_* variable that is already set wins over its Horovod twin, with a note
in the warning. A Horovod value that cannot be converted is a ValueError
naming the HOROVOD_* variable, on every rank.
"""

import math
import os
import warnings

PREFIX = "HOROVOD_"


def _number(name, value, low=0.0):
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < low:
        raise ValueError(f"keras_ddl: {name}={value!r} is not a number >= {low:g}, as Horovod "
                         f"reads it (keras_ddl maps it to its DDL_* twin at init)")
    return number


def _fusion_threshold(name, value):
    # Horovod counts bytes, keras_ddl megabytes.
    return repr(_number(name, value) / (1 << 20))


def _same_number(name, value):
    _number(name, value)
    return value.strip()


def _path(name, value):
    return value


def _hierarchical(name, value):
    flag = value.strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return "hierarchical"
    if flag in ("0", "false", "no", "off", ""):
        return None  # Horovod's default: nothing to carry over
    raise ValueError(f"keras_ddl: {name}={value!r} is not 0 or 1")


# HOROVOD_* name -> (DDL_* twin, conversion of the value; None: not set).
TWINS = {
    "HOROVOD_FUSION_THRESHOLD": ("DDL_FUSION_THRESHOLD_MB", _fusion_threshold),
    "HOROVOD_CYCLE_TIME": ("DDL_CYCLE_TIME_MS", _same_number),
    "HOROVOD_TIMELINE": ("DDL_TIMELINE", _path),
    "HOROVOD_CACHE_CAPACITY": ("DDL_CACHE_CAPACITY", _same_number),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("DDL_STALL_WARNING_S", _same_number),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("DDL_STALL_TIMEOUT_S", _same_number),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("DDL_ALLREDUCE", _hierarchical),
}


def apply(environ=os.environ):
    """Sets the DDL_* twin of every HOROVOD_* variable in ``environ``.

    Args:
        environ: The environment to read and update (``os.environ`` by
            default, so the engine sees the twins).

    Returns:
        A list of ``(horovod_name, note)`` pairs, one per HOROVOD_* variable
        set, sorted by name; ``note`` says what became of it.

    Raises:
        ValueError: A HOROVOD_* value that cannot be converted, naming it.
    """
    notes = []
    for name in sorted(k for k in environ if k.startswith(PREFIX)):
        value = environ[name]
        if name not in TWINS:
            notes.append((name, "ignored: keras_ddl has no equivalent"))
            continue
        twin, convert = TWINS[name]
        converted = convert(name, value)
        if converted is None:
            notes.append((name, f"{value!r} is Horovod's default: nothing to set"))
        elif twin in environ:
            notes.append((name, f"ignored: {twin}={environ[twin]!r} is set and wins"))
        else:
            environ[twin] = converted
            notes.append((name, f"mapped to {twin}={converted}"))
    return notes


def mapped_from(ddl_name, notes):
    """The HOROVOD_* variable that set ``ddl_name`` in ``notes``, or None
    (so an engine error about the twin can name what the user wrote)."""
    for name, note in notes:
        if note.startswith(f"mapped to {ddl_name}="):
            return name
    return None


def warn(notes, rank):
    """Warns once, on rank 0 only, listing every HOROVOD_* variable by name
    and what became of it."""
    if rank != 0 or not notes:
        return
    lines = "\n".join(f"  {name}: {note}" for name, note in notes)
    warnings.warn(f"keras_ddl: HOROVOD_* settings found in the environment (see "
                  f"docs/horovod_porting.md):\n{lines}", RuntimeWarning, stacklevel=3)
