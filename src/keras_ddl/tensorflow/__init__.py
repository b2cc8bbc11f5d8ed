"""The TensorFlow layer: collective ops on tensors, their gradients and
their compression, over the op library ``ddl_tf_ops.so``.

- ``library``: loads ``ddl_tf_ops.so`` beside the package, checking that it
  was built for this TensorFlow.
- ``collectives``: the ops' Python wrappers (allreduce, allgather,
  broadcast, alltoall, reducescatter, their grouped forms, barrier, join).
- ``gradients``: their gradients (``tf.RegisterGradient``), registered when
  ``collectives`` is imported.
- ``variable_broadcast``: ``broadcast_variables`` and the in-place
  ``broadcast_``.
- ``objects``: ``broadcast_object`` / ``allgather_object`` (pickled objects).
- ``compression``: ``Compression.none / fp16 / bf16``, the wire dtype.
- ``arguments``: ``ReduceOp``, the dtypes the ops take, and the checks of
  tensors, root ranks, factors and splits.
- ``naming``: the names that pair collectives across ranks.
- ``private_api``: every private TensorFlow / Keras touchpoint outside
  ``keras_ddl.keras.strategy``, with where and why.

This module exports the public names; ``keras_ddl.ops`` is an older name of
it.
"""

from .arguments import (MOVABLE_DTYPES, SUPPORTED_DTYPES, Average, Max, Min, Product,  # noqa: F401
                        ReduceOp, Sum)
from .collectives import (allgather, allreduce, alltoall, barrier, broadcast,  # noqa: F401
                          grouped_allgather, grouped_allreduce, grouped_reducescatter, join,
                          local_rank_op, local_size_op, rank_op, reducescatter, size_op)
from .compression import Compression  # noqa: F401
from .library import op_library  # noqa: F401
from .naming import auto_name  # noqa: F401
from .objects import allgather_object, broadcast_object  # noqa: F401
from .variable_broadcast import (broadcast_, broadcast_global_variables,  # noqa: F401
                                 broadcast_variables)
