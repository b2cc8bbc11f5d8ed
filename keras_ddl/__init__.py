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

from .basics import (allreduce_algorithm, cross_rank, cross_size, init, is_initialized, local_rank,
                     local_size,
                     rank, shutdown, size, traffic)
from .ops import (Average, Compression, Max, Min, Product, ReduceOp, Sum, allgather, allreduce,
                  barrier, broadcast, broadcast_variables, grouped_allreduce, reducescatter)
from .optimizer import DistributedGradientTape, DistributedOptimizer
from . import callbacks

__version__ = "0.1.0"

from . import optimizers, schedules  # noqa: E402  (large-batch recipes)
from .strategy import DDLStrategy, gather_predictions
