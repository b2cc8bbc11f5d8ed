"""Collective operations on TensorFlow tensors: every name, in one place.

The code lives in modules by concern: ``collectives`` (the wrappers),
``collective_gradients`` (their gradients), ``variable_broadcast``,
``compression``, ``op_arguments`` (reduction ops, dtypes, argument checks),
``op_naming`` (the names that pair collectives across ranks) and
``op_library`` (loading ``ddl_tf_ops.so``). This module re-exports them
under the names ``keras_ddl.ops`` has always had. The op library itself is
cached in ``op_library._lib``, not here.
"""

from .collective_gradients import (_allgather_grad, _allreduce_grad,  # noqa: F401
                                   _alltoall_grad, _broadcast_grad, _grouped_allreduce_grad,
                                   _reducescatter_grad)
from .collectives import (_allreduce_indexed_slices, _int_op, _not_converted,  # noqa: F401
                          allgather, allreduce, alltoall, barrier, broadcast, grouped_allgather,
                          grouped_allreduce, grouped_reducescatter, join, local_rank_op,
                          local_size_op, rank_op, reducescatter, scale, size_op)
from .compression import _WIRE_CODES, Compression  # noqa: F401
from .op_arguments import (_SUPPORTED_SET, CARRIED_AS, MOVABLE_DTYPES,  # noqa: F401
                           SUPPORTED_DTYPES, Average, Max, Min, Product, ReduceOp, Sum,
                           _check_factor, _check_root, _check_tensor, _from_wire,
                           _splits_input, _to_tensor, _to_wire, densify)
from .op_library import op_library  # noqa: F401
from .op_naming import (_eager_name_tensors, _eager_names, _grad_name_input,  # noqa: F401
                        _grad_names, _graph_names, _graph_order, _name_input, auto_name)
from .variable_broadcast import (_assign_and_read, _broadcast_calls,  # noqa: F401
                                 _broadcast_packed, broadcast_, broadcast_global_variables,
                                 broadcast_variables)
