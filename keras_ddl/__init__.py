"""keras_ddl: synchronous data-parallel training for Keras 3 / TensorFlow.

    import keras_ddl as ddl
    ddl.init()
    x = ddl.allreduce(x)              # average over all processes

Launch with ``mpiexec -n N python train.py`` (or ``ddlrun``); a script run
without a launcher is a world of size 1.
"""

from .basics import (allreduce_algorithm, cross_rank, cross_size, init, is_initialized, local_rank,
                     local_size,
                     rank, shutdown, size, traffic)
from .ops import (Average, Compression, Max, Min, Product, ReduceOp, Sum, allgather, allreduce,
                  barrier, broadcast, broadcast_variables, grouped_allreduce, reducescatter)

__version__ = "0.1.0"

from . import optimizers, schedules  # noqa: E402  (large-batch recipes)
