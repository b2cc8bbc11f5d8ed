"""keras_ddl: synchronous data-parallel training for Keras 3 / TensorFlow.

    import keras_ddl as ddl
    ddl.init()
    x = ddl.allreduce(x)              # average over all processes

Launch with ``mpiexec -n N python train.py`` (or ``ddlrun``); a script run
without a launcher is a world of size 1.
"""

import os as _os
import sys as _sys

# TensorFlow's default CPU allocator returns large buffers to the OS, so
# every step's gradient and allreduce outputs are fresh pages to fault in
# (tens of ms per 64 MB); the BFC allocator reuses them. It is read when
# TensorFlow makes its first CPU tensor, so set it early. Opt out with
# TF_CPU_ALLOCATOR_USE_BFC=false.
_os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# Under ``srun --mpi=pmi2``, MPICH's start-up requests are relayed to Slurm
# cut to a size Slurm reads whole (common/slurm_pmi.py). Started here, before
# the script can import mpi4py's MPI (which runs MPI_Init) through us.
from .common import slurm_pmi as _slurm_pmi  # noqa: E402

_slurm_pmi.start_relay()

# `python -m keras_ddl.bench --help` answers here, before TensorFlow loads.
from ._tool_help import answer_help_without_tensorflow as _answer_help  # noqa: E402

_answer_help()


def _installed_copy_if_unbuilt():
    """The directory of an installed, built keras_ddl when this one has no
    compiled libraries, else None.

    Python puts the current directory first on ``sys.path``, so ``python -m
    keras_ddl.bench`` or ``python -c "import keras_ddl"`` run from the
    repository root import the source tree, which has no libraries unless
    it was built in place (``python setup.py build_ext --inplace``). The
    package then takes its submodules, and their libraries, from the copy
    ``pip install .`` put in site-packages.
    """
    import sys
    from importlib.machinery import PathFinder

    here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.exists(_os.path.join(here, "build_info.json")):
        return None
    parent = _os.path.dirname(here)
    entries = [e for e in sys.path if _os.path.abspath(e or ".") != parent]
    candidates = [PathFinder.find_spec(__name__, entries)]
    for finder in sys.meta_path:  # editable installs register a finder here
        if finder is not PathFinder and hasattr(finder, "find_spec"):
            try:
                candidates.append(finder.find_spec(__name__, None))
            except Exception:  # a third-party finder; it does not know us
                pass
    for spec in candidates:
        for location in (spec and spec.submodule_search_locations) or ():
            if (_os.path.abspath(location) != here
                    and _os.path.exists(_os.path.join(location, "build_info.json"))):
                return _os.path.abspath(location)
    return None


_installed = _installed_copy_if_unbuilt()
if _installed is not None:
    import warnings as _warnings

    __path__[:] = [_installed]
    _warnings.warn(f"keras_ddl: {_os.path.dirname(_os.path.abspath(__file__))} (the source "
                   f"tree) has no compiled libraries; using the installed keras_ddl at "
                   f"{_installed}", RuntimeWarning, stacklevel=2)

from .common.basics import (allreduce_algorithm, cross_rank, cross_size, init,  # noqa: E402
                            is_initialized, local_rank, local_size, rank, shutdown, size,
                            timeline_mark, topology, traffic)

__version__ = "0.1.0"

# The TensorFlow-backed API. The Keras-serializable classes (LARS, the
# schedules, DistributedOptimizer) must be registered as soon as keras_ddl is
# imported, or keras.saving.load_model cannot find them in a new process.
from .tensorflow import (Average, Compression, Max, Min, Product, ReduceOp, Sum,  # noqa: E402
                         allgather, allgather_object, allreduce, alltoall, barrier, broadcast,
                         broadcast_, broadcast_global_variables, broadcast_object,
                         broadcast_variables, grouped_allgather, grouped_allreduce,
                         grouped_reducescatter, join, local_rank_op, local_size_op, rank_op,
                         reducescatter, size_op)
from .common.process_sets import ProcessSet, add_process_set, global_process_set  # noqa: E402
from .keras.distributed_optimizer import (DistributedGradientTape,  # noqa: E402
                                          DistributedOptimizer,
                                          PartialDistributedGradientTape,
                                          PartialDistributedOptimizer)
from .keras.sync_batch_norm import SyncBatchNormalization  # noqa: E402
from .keras import callbacks, data, optimizers, schedules  # noqa: E402
from .keras.optimizers import lars as _lars  # noqa: E402
from . import tensorflow as _tensorflow_layer  # noqa: E402

# Public module paths whose code lives in a layer's folder: keras_ddl.callbacks
# is keras_ddl.keras.callbacks, and so on. They are registered as the same
# module objects, so `import keras_ddl.callbacks` and `from
# keras_ddl.optimizers import LARS` keep working, and so does a model saved
# with a module path of the flat layout (keras_ddl.optimizers.lars).
# keras_ddl.ops is the older name of keras_ddl.tensorflow.
_MODULE_ALIASES = {"callbacks": callbacks, "data": data, "optimizers": optimizers,
                   "optimizers.lars": _lars, "schedules": schedules, "ops": _tensorflow_layer}
for _alias, _module in _MODULE_ALIASES.items():
    _sys.modules.setdefault(f"{__name__}.{_alias}", _module)
ops = _tensorflow_layer

# DDLStrategy uses private TensorFlow APIs and checks the TensorFlow version
# when loaded, so it is imported on first use.
_LAZY = {"DDLStrategy": ".keras.strategy", "gather_predictions": ".keras.strategy"}


def __getattr__(name):
    import importlib
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name == "strategy":
        value = importlib.import_module(".keras.strategy", __name__)
    else:
        raise AttributeError(f"module 'keras_ddl' has no attribute '{name}'")
    globals()[name] = value
    return value
