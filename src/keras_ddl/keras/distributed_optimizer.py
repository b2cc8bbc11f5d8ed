"""Gradient averaging for plain Keras training: DistributedOptimizer and
DistributedGradientTape.

Both work without any `tf.distribute` strategy: every process runs the same
single-process Keras script on its own shard of the data, and the gradients
are averaged across processes before the wrapped optimizer applies them. By
default each gradient's allreduce starts as soon as backprop has produced
that gradient (see `keras_ddl.keras.gradient_overlap`). Starting from the same
weights (see `keras_ddl.callbacks.BroadcastGlobalVariablesCallback`), every
process then makes the same update, bit for bit.
"""

import contextlib

import keras
import tensorflow as tf
from keras import ops

from ..tensorflow import private_api
from ..common import basics
from . import loss_scale
from ..tensorflow.compression import Compression
from .gradient_overlap import check_overlap_args, reduce_tensors
from ..tensorflow.arguments import Average, ReduceOp, Sum, densify

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


def _dense(grad, index=None):
    # Sparse gradients (embeddings) are densified: one fused allreduce of
    # dense tensors keeps every rank's update identical and the step simple.
    if isinstance(grad, tf.IndexedSlices):
        return densify(grad, "gradient" if index is None else f"gradient {index}")
    return grad


def _scaled_locals(grads, is_local, scale_local_gradients):
    """Local gradients, divided by size() when `scale_local_gradients` (as
    Horovod does), else as they are."""
    if not scale_local_gradients:
        return grads
    divisor = float(basics.size())
    out = []
    for g, local in zip(grads, is_local):
        if local and g is not None:
            if isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(g.values / divisor, g.indices, g.dense_shape)
            else:
                g = g / tf.cast(divisor, g.dtype)
        out.append(g)
    return out


def reduce_gradients_except_local(grads, is_local, scale_local_gradients=True, **kwargs):
    """`reduce_gradients` of the gradients whose `is_local` entry is False;
    the others (gradients of rank-local variables) are not communicated and
    come back as they are, or divided by `size()` with
    `scale_local_gradients`."""
    shared = [i for i, local in enumerate(is_local) if not local]
    reduced = reduce_gradients([grads[i] for i in shared], **kwargs)
    out = _scaled_locals(list(grads), is_local, scale_local_gradients)
    for i, r in zip(shared, reduced):
        out[i] = r
    return out


def reduce_gradients(grads, op=Average, compression=Compression.none, name=None,
                     overlap_gradients=True, bucket_bytes=None, predivide_factor=1.0):
    """Reduces a list of gradients across ranks.

    With `overlap_gradients` (in a graph) one allreduce per gradient, or per
    bucket of `bucket_bytes`, each starting as soon as its gradients exist;
    otherwise one grouped allreduce. `None` entries stay `None`;
    `tf.IndexedSlices` come back dense. At `size() == 1` the gradients are
    returned as they are (no collective). `predivide_factor` (Horovod's
    gradient_predivide_factor, with Average) divides the gradients by it
    before the sum and multiplies the average by it after: the same
    average, without the overflow of a float16 sum of large gradients.
    """
    grads = [None if g is None else _dense(g, i) for i, g in enumerate(grads)]
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present or basics.size() == 1:
        return grads
    reduced = reduce_tensors([grads[i] for i in present], op=op, overlap=overlap_gradients,
                             bucket_bytes=bucket_bytes, compression=compression, name=name,
                             prescale_factor=1.0 / predivide_factor,
                             postscale_factor=predivide_factor)
    out = list(grads)
    for i, r in zip(present, reduced):
        out[i] = r
    return out


def _refuse_under_ddl_strategy(what):
    """A DDLStrategy already sums the gradients across ranks: averaging them
    again here would be wrong twice over (double communication, and a
    gradient scaled by 1 / size once too often for a custom loss)."""
    if not tf.distribute.has_strategy():
        return
    extended = tf.distribute.get_strategy().extended
    if getattr(extended, "sums_gradients_across_ranks", False):
        raise ValueError(
            f"keras_ddl: {what} cannot be used under DDLStrategy.scope() (or in a model "
            "compiled there): the strategy already sums every gradient across ranks, so the "
            "gradients would be reduced twice. Under the strategy, compile with the plain "
            "optimizer (e.g. model.compile(keras.optimizers.SGD(...)), no "
            "DistributedOptimizer) and take gradients with a plain tf.GradientTape; or drop "
            "the strategy and keep DistributedOptimizer with "
            "ddl.callbacks.BroadcastGlobalVariablesCallback.")


def _check_not_xla():
    # The collectives are TensorFlow custom ops without XLA kernels.
    if private_api.in_xla_context():
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
    passed to `apply`/`apply_gradients`) are all-reduced (`op=ddl.Average`:
    the mean over ranks), then the wrapped optimizer applies them. Gradients
    that are `None` stay `None`; `tf.IndexedSlices` are densified. With equal
    per-rank batches and a loss that is a mean over the batch, the averaged
    gradient is the gradient of the mean loss over the global batch (all
    ranks' batches together).

    Overlap with backprop (`overlap_gradients=True`, the default): inside a
    `tf.function` (`model.fit`, unless `run_eagerly=True`) each gradient has
    its own allreduce, which starts as soon as backprop has produced that
    gradient, so communication of the last layers' gradients overlaps the
    backward pass through the first ones; the engine fuses the gradients
    that are ready in the same cycle into one transfer. `bucket_mb` groups
    them instead into buckets of about that many MB, filled from the last
    layer to the first (the order backprop produces them); a bucket starts
    when its last gradient exists. `overlap_gradients=False` issues one
    grouped allreduce of all gradients after the backward pass. The results
    are bitwise the same in every layout. Eagerly there is nothing to
    overlap: one grouped allreduce.

    The wrapped optimizer keeps its own state, learning rate, iterations and
    config: `learning_rate`, `iterations`, `variables`, `scale_loss` and
    `finalize_variable_values` are the wrapped optimizer's. Any Keras 3
    optimizer works (SGD, Adam, AdamW, Lamb, `keras_ddl.optimizers.LARS`, ...),
    including a `keras.optimizers.LossScaleOptimizer`. Under a
    `mixed_float16` policy `model.compile` wraps this optimizer in a
    `LossScaleOptimizer` by itself; either nesting is safe: the gradients
    are averaged before the loss-scale optimizer checks whether they are
    finite, so every rank decides the same and skips the same steps (with
    `gradient_accumulation_steps > 1` inside a `LossScaleOptimizer`, the
    ranks agree on the check instead: a micro-batch non-finite on any rank
    is skipped on all). See `keras_ddl.keras.loss_scale`.

    Not under `DDLStrategy`: the strategy already sums the gradients, so
    creating this optimizer in its scope, or using it in a model compiled
    there, is an error.

    Use `jit_compile=False` in `model.compile`: the allreduce is a custom op
    that XLA cannot compile.

    The collectives are named after the optimizer (`"<name>.gradients"`,
    one allreduce per gradient `"<name>.gradients.<i>"` for the i-th
    non-`None` gradient passed to `apply`, buckets
    `"<name>.gradients.bucket.<k>"`), so every rank must create its optimizers in
    the same order (the default names are numbered per process) or pass the
    same `name`.

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
            the gradients' dtype on the network (summed in it across
            nodes; within a node's shared memory in float32).
        gradient_accumulation_steps: Integer >= 1, or `None` (= 1). Number of
            local batches whose averaged gradient makes one update.
        name: Name of this optimizer (and of its collectives). Defaults to an
            automatic, per-process numbered `"distributed_optimizer"`.
        overlap_gradients: True (default): one allreduce per gradient (or
            per bucket), each starting when its gradients exist. False: one
            grouped allreduce of all gradients after the backward pass.
        bucket_mb: None (default): no buckets, one allreduce per gradient.
            A positive number: gradients go in buckets of at most this many
            MB (one grouped allreduce each), last layers first. Needs
            `overlap_gradients=True`.
        average_accumulated_gradients: With `gradient_accumulation_steps=k`,
            divide the local sum of the k gradients by k (True, default) or
            reduce the sum itself (False, Horovod's default for
            `backward_passes_per_step`).
        scale_local_gradients: Divide the gradients of rank-local variables
            (`register_local_var`, `PartialDistributedOptimizer`) by
            `size()`, as Horovod does (True, default), or leave them as
            they are (False).
    """

    def __init__(self, optimizer, op=Average, compression=Compression.none,
                 gradient_accumulation_steps=None, name=None, overlap_gradients=True,
                 bucket_mb=None, average_accumulated_gradients=True,
                 scale_local_gradients=True):
        _refuse_under_ddl_strategy("DistributedOptimizer")
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
        overlap, bucket_bytes = check_overlap_args(overlap_gradients, bucket_mb,
                                                   "DistributedOptimizer")
        super().__init__(learning_rate=0.0, name=name)
        self.overlap_gradients, self.bucket_mb, self._bucket_bytes = \
            overlap, bucket_mb, bucket_bytes
        self.inner_optimizer = optimizer
        self.op = _check_op(op)
        self.compression = _check_compression(compression)
        self.accumulation_steps = steps
        self.average_accumulated_gradients = bool(average_accumulated_gradients)
        self.scale_local_gradients = bool(scale_local_gradients)
        self._local_variable_ids = set()
        self._reduced_by_caller = 0
        # Horovod's gradient_predivide_factor (set by keras_ddl.horovod).
        self._predivide_factor = 1.0
        loss_scale.install()  # a LossScaleOptimizer around this one decides on reduced gradients

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
        _refuse_under_ddl_strategy("DistributedOptimizer")
        var_list = list(var_list)
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        super().build(var_list)  # only the variable index (no accumulation here)
        if self.accumulation_steps > 1:
            self._accumulators = self.add_optimizer_variables(var_list, "ddl_accumulated_grad")
            self._micro_steps = self.add_variable((), initializer="zeros", dtype="int",
                                                  name="ddl_micro_step")

    # The update.

    def register_local_var(self, var):
        """Makes `var` rank-local: its gradient is not reduced across ranks
        (see `PartialDistributedOptimizer`). Register the same variables on
        every rank, before the first update. Not saved in the config."""
        self._local_variable_ids.add(id(var))

    def _reduce(self, grads, variables=None):
        _refuse_under_ddl_strategy("DistributedOptimizer")
        if self._reduced_by_caller:
            return grads
        kwargs = dict(op=self.op, compression=self.compression, name=f"{self.name}.gradients",
                      overlap_gradients=self.overlap_gradients, bucket_bytes=self._bucket_bytes,
                      predivide_factor=self._predivide_factor)
        if not self._local_variable_ids:
            return reduce_gradients(grads, **kwargs)
        if variables is None:
            variables = self._trainable_variables
        is_local = [id(v) in self._local_variable_ids for v in variables]
        return reduce_gradients_except_local(grads, is_local, self.scale_local_gradients,
                                             **kwargs)

    def reduce_ahead_of_loss_scale(self, grads, trainable_variables):
        """For ``loss_scale``: the gradients reduced across ranks and the
        block in which ``apply`` takes them as reduced, or None when this
        optimizer reduces only every k-th step (gradient accumulation); the
        ranks then agree on the finiteness check instead."""
        if self.accumulation_steps != 1:
            return None
        return self._reduce(grads, trainable_variables), self._gradients_reduced_by_caller()

    @contextlib.contextmanager
    def _gradients_reduced_by_caller(self):
        """While tracing (or running) the block, `apply` takes its gradients
        as already reduced: a LossScaleOptimizer around this optimizer has
        reduced them, with `_reduce`, before its finiteness check."""
        self._reduced_by_caller += 1
        try:
            yield
        finally:
            self._reduced_by_caller -= 1

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
        grads = [None if g is None else _dense(g, i) for i, g in enumerate(grads)]
        if self.accumulation_steps == 1:
            self.inner_optimizer.apply(self._reduce(grads, trainable_variables),
                                       trainable_variables)
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
            divisor = steps if self.average_accumulated_gradients else 1
            means = [None if g is None else (g + ops.cast(a, g.dtype)) / ops.cast(divisor, g.dtype)
                     for g, a in zip(grads, accumulators)]
            self.inner_optimizer.apply(self._reduce(means, trainable_variables),
                                       trainable_variables)
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
            "overlap_gradients": self.overlap_gradients,
            "bucket_mb": self.bucket_mb,
            "average_accumulated_gradients": self.average_accumulated_gradients,
            "scale_local_gradients": self.scale_local_gradients,
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
    Each `gradient()` call all-reduces the non-`None` gradients (`None`
    stays `None`, `tf.IndexedSlices` come back dense): inside a
    `tf.function`, by default, one allreduce per gradient that starts as
    soon as that gradient exists (as `DistributedOptimizer` does; eagerly,
    one grouped allreduce). Every rank must call `gradient()` the same
    number of times with the same structure of sources. Use it with a plain
    optimizer, not with a `DistributedOptimizer` (that would average twice),
    and not under `DDLStrategy` (which sums the gradients itself). Other
    attributes and methods (`watch`, `stop_recording`, `jacobian`, ...) are
    the wrapped tape's.

    Args:
        tape: The `tf.GradientTape` to wrap.
        op: `ddl.Average` (default) or `ddl.Sum`.
        compression: `ddl.Compression.none` (default), `.fp16` or `.bf16`.
        name: Optional name (prefix) of the collectives. By default they are
            named like any unnamed collective: by their graph nodes inside
            `tf.function`, by call order in eager mode.
        overlap_gradients, bucket_mb: as for `DistributedOptimizer`.
        scale_local_gradients: Divide the gradients of rank-local sources
            (`register_local_source`, `PartialDistributedGradientTape`) by
            `size()`, as Horovod does (True, default), or not (False).
    """

    def __init__(self, tape, op=Average, compression=Compression.none, name=None,
                 overlap_gradients=True, bucket_mb=None, scale_local_gradients=True):
        if not isinstance(tape, tf.GradientTape):
            raise TypeError(f"keras_ddl: DistributedGradientTape wraps a tf.GradientTape, "
                            f"got {type(tape).__name__}")
        self._tape = tape
        self._op = _check_op(op)
        self._compression = _check_compression(compression)
        self._name = name
        self._overlap, self._bucket_bytes = check_overlap_args(
            overlap_gradients, bucket_mb, "DistributedGradientTape")
        self._scale_local_gradients = bool(scale_local_gradients)
        self._local_source_ids = set()
        # Horovod's gradient_predivide_factor (set by keras_ddl.horovod).
        self._predivide_factor = 1.0

    def register_local_source(self, source):
        """Makes `source` rank-local: its gradient is not reduced across
        ranks. Register the same sources on every rank."""
        self._local_source_ids.add(id(source))

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
        _refuse_under_ddl_strategy("DistributedGradientTape")
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads, expand_composites=False)
        kwargs = dict(op=self._op, compression=self._compression, name=self._name,
                      overlap_gradients=self._overlap, bucket_bytes=self._bucket_bytes,
                      predivide_factor=self._predivide_factor)
        if self._local_source_ids:
            is_local = [id(s) in self._local_source_ids
                        for s in tf.nest.flatten(sources, expand_composites=False)]
            reduced = reduce_gradients_except_local(flat, is_local, self._scale_local_gradients,
                                                    **kwargs)
        else:
            reduced = reduce_gradients(flat, **kwargs)
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)


def _local_layer_variables(local_layers, owner):
    """The trainable variables of `local_layers` (a layer or a list)."""
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    variables = []
    for i, layer in enumerate(local_layers):
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(f"keras_ddl: {owner}(local_layers=...) takes Keras layers; item {i} "
                            f"is a {type(layer).__name__}")
        if not layer.trainable_weights:
            raise ValueError(
                f"keras_ddl: {owner}: local layer {layer.name!r} has no trainable weights "
                "yet; build the model (call it once, or model.build) before creating the "
                "optimizer or tape")
        variables.extend(layer.trainable_weights)
    return variables


def _with_local_layers(wrapper, wrapped, local_layers, scale_local_gradients, kwargs, owner,
                       register):
    """``wrapper(wrapped, ...)`` with the trainable variables of
    ``local_layers`` registered as local through its method ``register``:
    the Partial* wrappers differ only in those three. The layers are checked
    first, so a bad one is refused before anything is wrapped."""
    variables = _local_layer_variables(local_layers, owner)
    distributed = wrapper(wrapped, scale_local_gradients=scale_local_gradients, **kwargs)
    for variable in variables:
        getattr(distributed, register)(variable)
    return distributed


def PartialDistributedOptimizer(optimizer, local_layers=None, scale_local_gradients=True,
                                **kwargs):
    """A `DistributedOptimizer` that does not reduce the gradients of
    `local_layers`: each rank trains its own copy of those layers.

    ```python
    opt = ddl.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                          local_layers=[model.get_layer("head")])
    ```

    The layers must be built. The same layers must be local on every rank.
    Pass their variables to `BroadcastGlobalVariablesCallback(local_variables=...)`
    if their initial values should stay rank-specific too. Which variables
    are local is not part of the optimizer's config: after loading a saved
    model, register them again with `optimizer.register_local_var(var)`.

    Args:
        optimizer: The Keras 3 optimizer to wrap.
        local_layers: A Keras layer or a list of them (or None: nothing is
            local, the plain `DistributedOptimizer`).
        scale_local_gradients: Divide the local gradients by `size()` (True,
            default, as Horovod) or not.
        **kwargs: The other arguments of `DistributedOptimizer`.
    """
    return _with_local_layers(DistributedOptimizer, optimizer, local_layers,
                              scale_local_gradients, kwargs, "PartialDistributedOptimizer",
                              "register_local_var")


def PartialDistributedGradientTape(tape, local_layers=None, scale_local_gradients=True,
                                   **kwargs):
    """A `DistributedGradientTape` that does not reduce the gradients of
    `local_layers`' trainable variables (see `PartialDistributedOptimizer`).

    Args:
        tape: The `tf.GradientTape` to wrap.
        local_layers: A Keras layer or a list of them, built, or None.
        scale_local_gradients: Divide the local gradients by `size()` (True,
            default, as Horovod) or not.
        **kwargs: The other arguments of `DistributedGradientTape`.
    """
    return _with_local_layers(DistributedGradientTape, tape, local_layers,
                              scale_local_gradients, kwargs, "PartialDistributedGradientTape",
                              "register_local_source")
