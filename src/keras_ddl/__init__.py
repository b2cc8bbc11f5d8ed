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

# Under ``srun --mpi=pmi2``, MPICH's start-up requests are relayed to Slurm
# cut to a size Slurm reads whole (common/slurm_pmi.py). Started here, before
# the script can import mpi4py's MPI (which runs MPI_Init) through us.
from .common import slurm_pmi as _slurm_pmi  # noqa: E402

_slurm_pmi.start_relay()

from .common.basics import (allreduce_algorithm, cross_rank, cross_size, init,  # noqa: E402
                            is_initialized, local_rank, local_size, rank, settings_in_force,
                            shutdown, size, timeline_mark, topology, traffic)

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
# Public module paths whose code lives in a layer's folder: keras_ddl.callbacks,
# .data, .optimizers (and .optimizers.lars, the path of models saved before
# the split), .schedules; keras_ddl.ops is the older name of
# keras_ddl.tensorflow. Each is a module of its own that re-exports its
# layer's objects.
from . import callbacks, data, ops, optimizers, schedules  # noqa: E402

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
