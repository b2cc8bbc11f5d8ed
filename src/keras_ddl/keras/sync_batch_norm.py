"""Batch normalization whose training statistics cover the global batch."""

import keras
import tensorflow as tf

from ..common import basics
from ..tensorflow.collectives import allreduce
from ..tensorflow.arguments import Sum


def _drop_keras2_arguments(kwargs):
    """Removes the Keras 2 (tf.keras) arguments Horovod's layer took: those
    without a meaning in Keras 3 are ignored; those that would change the
    results are refused, by name.

    Ignored: `fused` (a kernel choice; the statistics are the same), and
    `renorm=False` with its `renorm_clipping` / `renorm_momentum` (unused
    without renorm), `virtual_batch_size=None`, `adjustment=None`.
    Refused: `renorm=True`, a `virtual_batch_size`, an `adjustment`.
    """
    kwargs.pop("fused", None)
    renorm = kwargs.pop("renorm", False)
    clipping = kwargs.pop("renorm_clipping", None)
    momentum = kwargs.pop("renorm_momentum", 0.99)
    if renorm:
        raise NotImplementedError(
            f"keras_ddl: SyncBatchNormalization(renorm=True, renorm_clipping={clipping!r}, "
            f"renorm_momentum={momentum!r}) is not supported: batch renormalization changes "
            f"the results and Keras 3 has none (rank {basics.rank()})")
    for name in ("virtual_batch_size", "adjustment"):
        value = kwargs.pop(name, None)
        if value is not None:
            raise NotImplementedError(
                f"keras_ddl: SyncBatchNormalization({name}={value!r}) is not supported: it "
                "changes the statistics and Keras 3 has no such argument; leave it None "
                f"(rank {basics.rank()})")


@keras.saving.register_keras_serializable(package="keras_ddl")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` over all ranks' batches together.

    In training mode the mean and variance are those of the global batch
    (every rank's batch, weighted by its number of elements: batches may
    differ in size between ranks), so the output, the moving statistics and
    the gradients equal those of `BatchNormalization` run by one process on
    the concatenated batch. Each training call costs one allreduce of
    `3 * channels` numbers (the per-channel sums of x, of x squared and the
    counts). Every rank must call the layer in training mode together.
    Inference uses the moving statistics, with no communication. At
    `size() == 1` it is `BatchNormalization`.

    The variance is `E[x^2] - E[x]^2` in float32 (or float64 for float64
    inputs), clipped at 0, as Keras computes synchronized statistics.

    Args:
        axis, momentum, epsilon, center, scale: As in
            `keras.layers.BatchNormalization`.
        beta_initializer, gamma_initializer: As in BatchNormalization.
        moving_mean_initializer, moving_variance_initializer: As in
            BatchNormalization.
        beta_regularizer, gamma_regularizer: As in BatchNormalization.
        beta_constraint, gamma_constraint: As in BatchNormalization.
        **kwargs: The other arguments of `keras.layers.BatchNormalization`,
            except `synchronized`, which must stay False (this layer
            synchronizes through keras_ddl, not through a tf.distribute
            strategy). Keras 2 arguments of Horovod's layer are accepted
            where they change nothing (`fused`, `renorm=False`, ...) and
            refused by name where they would.
    """

    def __init__(self, axis=-1, momentum=0.99, epsilon=1e-3, center=True, scale=True,
                 beta_initializer="zeros", gamma_initializer="ones",
                 moving_mean_initializer="zeros", moving_variance_initializer="ones",
                 beta_regularizer=None, gamma_regularizer=None, beta_constraint=None,
                 gamma_constraint=None, **kwargs):
        _drop_keras2_arguments(kwargs)
        if kwargs.pop("synchronized", False):
            raise ValueError("keras_ddl: SyncBatchNormalization(synchronized=True) is not "
                             "supported: the layer already computes statistics over all "
                             "ranks; leave synchronized at False")
        super().__init__(axis=axis, momentum=momentum, epsilon=epsilon, center=center,
                         scale=scale, beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer,
                         moving_mean_initializer=moving_mean_initializer,
                         moving_variance_initializer=moving_variance_initializer,
                         beta_regularizer=beta_regularizer, gamma_regularizer=gamma_regularizer,
                         beta_constraint=beta_constraint, gamma_constraint=gamma_constraint,
                         **kwargs)

    def _moments(self, inputs, mask):
        if basics.size() == 1:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), inputs.dtype),
                                      tf.shape(inputs))
        local_sum = tf.reduce_sum(inputs * weights, axis=axes)
        local_squares = tf.reduce_sum(tf.square(inputs) * weights, axis=axes)
        local_count = tf.reduce_sum(weights, axis=axes)
        channels = tf.shape(local_sum)
        packed = tf.concat([tf.reshape(t, [-1]) for t in (local_sum, local_squares,
                                                          local_count)], axis=0)
        total_sum, total_squares, total_count = tf.split(allreduce(packed, op=Sum), 3)
        mean = tf.math.divide_no_nan(total_sum, total_count)
        mean_of_squares = tf.math.divide_no_nan(total_squares, total_count)
        variance = tf.maximum(mean_of_squares - tf.square(mean), 0.0)
        return tf.reshape(mean, channels), tf.reshape(variance, channels)

    def get_config(self):
        config = super().get_config()
        config.pop("synchronized", None)
        return config
