"""Wire compression of floating tensors (``Compression.none``, ``.fp16``,
``.bf16``)."""

import tensorflow as tf


# The core's codes for the dtypes it can send a float32 allreduce in
# (DataType in custom_ops/common/types.h).
_WIRE_CODES = {tf.float16: 0, tf.bfloat16: 1}


class Compression:
    """Wire compression for floating tensors: sent in a 16-bit float dtype.

    A float32 allreduce is converted by the core as it packs the fused
    buffer and back as it unpacks it; across nodes the sum is taken in the
    wire dtype, inside a node's shared memory in float32. A float32
    ``Average`` is divided before the wire (each rank's values, or a node's
    float32 sum, by the number of ranks taking part), so it overflows the
    16-bit dtype only where its result would. Other floating dtypes are
    cast before the collective and back after it, and sum in the 16-bit
    dtype: their ``Average`` can overflow where float32 would not.
    """

    class _Cast:
        def __init__(self, wire_dtype, label):
            self.wire_dtype = wire_dtype
            self.label = label

        def engine_wire(self, tensor):
            """The op's ``wire_dtype``: the core converts ``tensor`` (-1: it does not)."""
            if self.wire_dtype is not None and tensor.dtype == tf.float32:
                return _WIRE_CODES[self.wire_dtype]
            return -1

        def compress(self, tensor):
            if self.engine_wire(tensor) >= 0:
                return tensor, None
            if tensor.dtype.is_floating and tensor.dtype != self.wire_dtype:
                return tf.cast(tensor, self.wire_dtype), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, original_dtype):
            return tensor if original_dtype is None else tf.cast(tensor, original_dtype)

        def __repr__(self):
            return f"Compression.{self.label}"

    class _NoCompression(_Cast):
        def compress(self, tensor):
            return tensor, None

    none = _NoCompression(None, "none")
    fp16 = _Cast(tf.float16, "fp16")
    bf16 = _Cast(tf.bfloat16, "bf16")
