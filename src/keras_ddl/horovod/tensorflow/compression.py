"""Horovod's gradient compressors (`hvd.Compression`), usable on their own.

`Compression.fp16.compress(tensor)` returns `(compressed, ctx)`: a float16
tensor for a floating one (others unchanged) and what `decompress(tensor,
ctx)` needs to restore the dtype, as in Horovod. Passed to a collective,
`Compression.none` and `.fp16` run as keras_ddl's own compressions (fp16: the
engine converts float32 on the wire); any other `Compressor` subclass is
applied around the collective in Python.
"""

import tensorflow as tf

import keras_ddl as ddl


class Compressor:
    """Interface of a compressor: both methods are static, as in Horovod."""

    @staticmethod
    def compress(tensor):
        """Returns `(compressed tensor, ctx)`."""
        raise NotImplementedError("Compressor.compress must be implemented by a subclass")

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor `compress` was given, from the compressed one and `ctx`."""
        raise NotImplementedError("Compressor.decompress must be implemented by a subclass")


class NoneCompressor(Compressor):
    """Leaves tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Casts floating tensors to float16; `ctx` is the original dtype."""

    @staticmethod
    def compress(tensor):
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating and tensor.dtype != ctx:
            return tf.cast(tensor, ctx)
        return tensor


class Compression:
    """The compressors by name: `Compression.none`, `Compression.fp16`
    (and keras_ddl's `Compression.bf16`, which has no Horovod class)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = ddl.Compression.bf16


def engine_compression(compression, function):
    """(keras_ddl compression for the collective, Python compressor or None).

    Horovod's classes and keras_ddl's own objects map to keras_ddl's
    compressions; another `Compressor` (class or instance) is applied in
    Python around an uncompressed collective; anything else is refused,
    naming the argument.
    """
    if compression in (None, NoneCompressor, ddl.Compression.none):
        return ddl.Compression.none, None
    if compression in (FP16Compressor, ddl.Compression.fp16):
        return ddl.Compression.fp16, None
    if compression is ddl.Compression.bf16:
        return compression, None
    if isinstance(compression, Compressor) or (isinstance(compression, type)
                                               and issubclass(compression, Compressor)):
        return ddl.Compression.none, compression
    raise NotImplementedError(
        f"keras_ddl.horovod: {function}(compression={compression!r}): pass "
        "hvd.Compression.none, hvd.Compression.fp16 or a hvd.Compressor subclass "
        f"(rank {ddl.rank()})")
