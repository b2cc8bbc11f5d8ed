"""Gradient averaging for plain Keras training: DistributedOptimizer and
DistributedGradientTape.

Both work without any `tf.distribute` strategy: every process runs the same
single-process Keras script on its own shard of the data, and the gradients
are averaged across processes (one grouped allreduce per update) before the
wrapped optimizer applies them. Starting from the same weights (see
`keras_ddl.callbacks.BroadcastGlobalVariablesCallback`), every process then
makes the same update, bit for bit.
"""

import warnings

import keras
import tensorflow as tf
from keras import ops

from . import basics
from .ops import Average, Compression, ReduceOp, Sum, grouped_allreduce

_COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16, "bf16": Compression.bf16}


def _check_op(op):
    try:
        op = ReduceOp(op) if not isinstance(op, str) else ReduceOp[op]
    except (KeyError, ValueError):
        raise ValueError(f"keras_ddl: op must be ddl.Average or ddl.Sum, got {op!r}") from None
    if op not in (Average, Sum):
        raise ValueError(f"keras_ddl: gradients can be combined with ddl.Average or ddl.Sum, "
                         f"not {op.name}")
    return op


def _check_compression(compression):
    if isinstance(compression, str):
        if compression not in _COMPRESSIONS:
            raise ValueError(f"keras_ddl: compression must be one of {sorted(_COMPRESSIONS)}, "
                             f"got {compression!r}")
        return _COMPRESSIONS[compression]
    if compression not in _COMPRESSIONS.values():
        raise ValueError("keras_ddl: compression must be ddl.Compression.none, .fp16 or .bf16, "
                         f"got {compression!r}")
    return compression


def _compression_name(compression):
    return next(k for k, v in _COMPRESSIONS.items() if v is compression)


def _dense(grad):
    # Sparse gradients (embeddings) are densified: one fused allreduce of
    # dense tensors keeps every rank's update identical and the step simple.
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


def reduce_gradients(grads, op=Average, compression=Compression.none, name=None):
    """Reduces a list of gradients across ranks in one grouped allreduce.

    `None` entries stay `None`; `tf.IndexedSlices` come back dense. At
    `size() == 1` the gradients are returned as they are (no collective).
    """
    grads = [None if g is None else _dense(g) for g in grads]
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present or basics.size() == 1:
        return grads
    reduced = grouped_allreduce([grads[i] for i in present], op=op, name=name,
                                compression=compression)
    out = list(grads)
    for i, r in zip(present, reduced):
        out[i] = r
    return out


def _check_not_xla():
    # The collectives are TensorFlow custom ops without XLA kernels.
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())
    except Exception:  # private API moved: let TensorFlow report it
        return
    if in_xla:
        raise ValueError(
            "keras_ddl: DistributedOptimizer cannot run inside XLA (jit_compile=True): its "
            "allreduce is a custom TensorFlow op. Compile the model with "
            "model.compile(..., jit_compile=False).")


@keras.saving.register_keras_serializable(package="keras_ddl")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wraps a Keras 3 optimizer so gradients are averaged over all ranks.

    ```python
    opt = ddl.DistributedOptimizer(keras.optimizers.SGD(0.1 * ddl.size()))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    model.fit(x_shard, y_shard,
              callbacks=[ddl.callbacks.BroadcastGlobalVariablesCallback(0)])
    ```

    Each update, the gradients of this rank (computed by `model.fit` or
    passed to `apply`/`apply_gradients`) go through one grouped allreduce
    (`op=ddl.Average`: the mean over ranks), then the wrapped optimizer
    applies them. Gradients that are `None` stay `None`; `tf.IndexedSlices`
    are densified. With equal per-rank batches and a loss that is a mean over
    the batch, the averaged gradient is the gradient of the mean loss over
    the global batch (all ranks' batches together).

    The wrapped optimizer keeps its own state, learning rate, iterations and
    config: `learning_rate`, `iterations`, `variables`, `scale_loss` and
    `finalize_variable_values` are the wrapped optimizer's. Any Keras 3
    optimizer works (SGD, Adam, AdamW, Lamb, `keras_ddl.optimizers.LARS`, ...),
    including a `keras.optimizers.LossScaleOptimizer`: wrap it, not the other
    way round, so every rank sees the same (averaged) gradients when it
    decides whether they are finite. Under a `mixed_float16` policy, use
    `DistributedOptimizer(LossScaleOptimizer(opt))` and
    `model.compile(..., auto_scale_loss=False)`; otherwise `compile` wraps
    this optimizer in another LossScaleOptimizer, which checks finiteness
    before the allreduce (rank-local) and can leave the ranks waiting for
    each other.

    Use `jit_compile=False` in `model.compile`: the allreduce is a custom op
    that XLA cannot compile.

    The collective is named after the optimizer (`"<name>.gradients"`), so
    every rank must create its optimizers in the same order (the default
    names are numbered per process) or pass the same `name`.

    Gradient accumulation: with `gradient_accumulation_steps=k`, each rank
    sums its gradients locally over `k` calls without communicating; on the
    k-th call it divides the sum by `k`, averages it over ranks (one
    allreduce) and the wrapped optimizer makes one update. Communication
    happens once per update, not once per batch; the wrapped optimizer's
    `iterations` counts updates, and learning-rate schedules see it. The
    partial sums are rank-local and are not part of `variables`: they are
    not broadcast, saved or restored, so a model saved in the middle of an
    accumulation starts a fresh one when loaded (make `steps_per_epoch` a
    multiple of `k` to checkpoint at update boundaries). The wrapped
    optimizer's own Keras `gradient_accumulation_steps` also works, but then
    the allreduce runs at every batch.

    Args:
        optimizer: The Keras 3 optimizer to wrap.
        op: `ddl.Average` (default) or `ddl.Sum`.
        compression: `ddl.Compression.none` (default), `.fp16` or `.bf16`:
            the gradients' dtype on the wire.
        gradient_accumulation_steps: Integer >= 1, or `None` (= 1). Number of
            local batches whose averaged gradient makes one update.
        name: Name of this optimizer (and of its collective). Defaults to an
            automatic, per-process numbered `"distributed_optimizer"`.
    """

    def __init__(self, optimizer, op=Average, compression=Compression.none,
                 gradient_accumulation_steps=None, name=None):
        if isinstance(optimizer, dict):  # a serialized optimizer
            optimizer = keras.optimizers.deserialize(optimizer)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError("keras_ddl: DistributedOptimizer wraps a Keras 3 optimizer "
                            f"(keras.optimizers.Optimizer), got {type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("keras_ddl: this optimizer is already a DistributedOptimizer; "
                             "wrapping it again would average the gradients twice")
        steps = 1 if gradient_accumulation_steps is None else gradient_accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError("keras_ddl: gradient_accumulation_steps must be an integer >= 1 "
                             f"(or None), got {gradient_accumulation_steps!r}")
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = optimizer
        self.op = _check_op(op)
        self.compression = _check_compression(compression)
        self.accumulation_steps = steps
        policy = keras.mixed_precision.global_policy().name
        if policy == "mixed_float16" and not isinstance(
                optimizer, keras.optimizers.LossScaleOptimizer):
            warnings.warn(
                "keras_ddl: under the mixed_float16 policy, wrap a LossScaleOptimizer: "
                "DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt)), and compile "
                "with auto_scale_loss=False. A LossScaleOptimizer around the "
                "DistributedOptimizer decides on rank-local gradients and can stall the ranks.",
                stacklevel=2)

    # What the rest of Keras sees is the wrapped optimizer's state.

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.inner_optimizer.learning_rate = value

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def variables(self):
        # The wrapped optimizer's, in its order. The accumulators (and their
        # counter) are left out on purpose: they hold this rank's partial
        # sums, which must be neither broadcast nor restored on other ranks.
        return self.inner_optimizer.variables

    def set_weights(self, weights):
        variables = self.variables
        if len(weights) != len(variables):
            raise ValueError(f"keras_ddl: expected {len(variables)} optimizer weights, "
                             f"got {len(weights)}")
        for variable, weight in zip(variables, weights):
            variable.assign(weight)

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    def build(self, var_list):
        if self.built:
            return
        var_list = list(var_list)
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        super().build(var_list)  # only the variable index (no accumulation here)
        if self.accumulation_steps > 1:
            self._accumulators = self.add_optimizer_variables(var_list, "ddl_accumulated_grad")
            self._micro_steps = self.add_variable((), initializer="zeros", dtype="int",
                                                  name="ddl_micro_step")

    # The update.

    def _reduce(self, grads):
        return reduce_gradients(grads, op=self.op, compression=self.compression,
                                name=f"{self.name}.gradients")

    def apply(self, grads, trainable_variables=None):
        """Averages `grads` over ranks, then applies them with the wrapped optimizer."""
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if len(trainable_variables) != len(grads):
                raise ValueError(f"keras_ddl: {len(grads)} gradients for "
                                 f"{len(trainable_variables)} variables")
        if not self.built:
            if trainable_variables is None:
                raise ValueError("keras_ddl: the first apply() needs trainable_variables "
                                 "(or call optimizer.build(variables) first)")
            self.build(trainable_variables)
        if not tf.executing_eagerly():
            _check_not_xla()
        grads = [None if g is None else _dense(g) for g in grads]
        if self.accumulation_steps == 1:
            self.inner_optimizer.apply(self._reduce(grads), trainable_variables)
            return
        self._accumulate_and_apply(grads, trainable_variables)

    def _accumulate_and_apply(self, grads, trainable_variables):
        if trainable_variables is None:
            accumulators = list(self._accumulators)
        else:
            accumulators = [self._accumulators[self._get_variable_index(v)]
                            for v in trainable_variables]
        steps = self.accumulation_steps
        is_update = ops.equal((self._micro_steps + 1) % steps, 0)

        def update():
            means = [None if g is None else (g + ops.cast(a, g.dtype)) / ops.cast(steps, g.dtype)
                     for g, a in zip(grads, accumulators)]
            self.inner_optimizer.apply(self._reduce(means), trainable_variables)
            for a in self._accumulators:
                if a is not None:
                    a.assign(ops.zeros_like(a))

        def accumulate():
            for g, a in zip(grads, accumulators):
                if g is not None and a is not None:
                    a.assign_add(ops.cast(g, a.dtype))

        ops.cond(is_update, update, accumulate)
        self._micro_steps.assign_add(1)

    def apply_gradients(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return self.iterations
        grads, variables = zip(*grads_and_vars)
        self.apply(grads, variables)
        return self.iterations

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise NotImplementedError("keras_ddl: DistributedOptimizer runs on the TensorFlow "
                                  "backend only (stateless_apply is for JAX)")

    # Serialization: the wrapped optimizer's full config is kept.

    def get_config(self):
        return {
            "name": self.name,
            "optimizer": keras.optimizers.serialize(self.inner_optimizer),
            "op": self.op.name,
            "compression": _compression_name(self.compression),
            "gradient_accumulation_steps": self.accumulation_steps,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"),
                                                      custom_objects=custom_objects)
        return cls(inner, **config)


class DistributedGradientTape:
    """A `tf.GradientTape` whose `gradient()` averages over all ranks.

    ```python
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = ddl.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    ```

    It can also be entered directly:
    `with ddl.DistributedGradientTape(tf.GradientTape()) as tape:`.
    Each `gradient()` call issues one grouped allreduce of the non-`None`
    gradients (`None` stays `None`, `tf.IndexedSlices` come back dense).
    Every rank must call `gradient()` the same number of times with the same
    structure of sources. Use it with a plain optimizer, not with a
    `DistributedOptimizer` (that would average twice). Other attributes and
    methods (`watch`, `stop_recording`, `jacobian`, ...) are the wrapped
    tape's.

    Args:
        tape: The `tf.GradientTape` to wrap.
        op: `ddl.Average` (default) or `ddl.Sum`.
        compression: `ddl.Compression.none` (default), `.fp16` or `.bf16`.
        name: Optional name of the collective. By default it is named like
            any unnamed collective: by its graph node inside `tf.function`,
            by call order in eager mode.
    """

    def __init__(self, tape, op=Average, compression=Compression.none, name=None):
        if not isinstance(tape, tf.GradientTape):
            raise TypeError(f"keras_ddl: DistributedGradientTape wraps a tf.GradientTape, "
                            f"got {type(tape).__name__}")
        self._tape = tape
        self._op = _check_op(op)
        self._compression = _check_compression(compression)
        self._name = name

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self._tape.__exit__(*exc_info)

    def __getattr__(self, attr):
        if attr == "_tape":  # not set yet (e.g. while copying): no recursion
            raise AttributeError(attr)
        return getattr(self._tape, attr)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = reduce_gradients(flat, op=self._op, compression=self._compression,
                                   name=self._name)
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)
