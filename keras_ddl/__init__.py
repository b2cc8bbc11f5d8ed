"""keras_ddl: synchronous data-parallel training for Keras 3 / TensorFlow.

    import keras_ddl as ddl
    ddl.init()
    x = ddl.allreduce(x)              # average over all processes

Launch with ``mpiexec -n N python train.py`` (or ``ddlrun``); a script run
without a launcher is a world of size 1.
"""

import os as _os

# TensorFlow's default CPU allocator returns large buffers to the OS, so
# every step's gradient and allreduce outputs are fresh pages to fault in
# (tens of ms per 64 MB); the BFC allocator reuses them. It is read when
# TensorFlow makes its first CPU tensor, so set it early. Opt out with
# TF_CPU_ALLOCATOR_USE_BFC=false.
_os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

from .basics import (allreduce_algorithm, cross_rank, cross_size, init, is_initialized,
                     local_rank, local_size, rank, shutdown, size, timeline_mark, traffic)

__version__ = "0.1.0"

# Everything that needs TensorFlow loads on first use, so tools that only
# need the process model (ddlrun, rank queries) start without importing it.
_LAZY = {
    ".ops": ["Average", "Compression", "Max", "Min", "Product", "ReduceOp", "Sum", "allgather",
             "allreduce", "barrier", "broadcast", "broadcast_variables", "grouped_allreduce",
             "reducescatter"],
    ".optimizer": ["DistributedGradientTape", "DistributedOptimizer"],
    ".strategy": ["DDLStrategy", "gather_predictions"],
}
_LAZY_ATTRS = {name: module for module, names in _LAZY.items() for name in names}
_SUBMODULES = ("callbacks", "optimizers", "schedules", "ops", "optimizer", "strategy", "bench")


def __getattr__(name):
    import importlib
    if name in _LAZY_ATTRS:
        value = getattr(importlib.import_module(_LAZY_ATTRS[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError(f"module 'keras_ddl' has no attribute '{name}'")
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY_ATTRS) + list(_SUBMODULES))
