"""Keras callbacks for data-parallel training with `model.fit`.

```python
callbacks = [
    ddl.callbacks.BackupAndRestore("backup"),            # first: resume after a kill
    ddl.callbacks.BroadcastGlobalVariablesCallback(0),   # same start on every rank
    ddl.callbacks.MetricAverageCallback(),               # before anything reading logs
    ddl.callbacks.LearningRateWarmupCallback(initial_lr=0.1 * ddl.size(), warmup_epochs=5),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss"),   # sees global values
    ddl.callbacks.on_rank(0, keras.callbacks.ModelCheckpoint("ckpt-{epoch}.keras")),
]
```

Every callback here except `on_rank`'s wrapped callback must be given to
`fit` on every rank, in the same order: they issue collectives (broadcast,
metric average) or change the learning rate, and every rank must do the
same.
"""

import numbers

import keras
import numpy as np
import tensorflow as tf

from ..tensorflow import private_api
from ..common import basics
from ..common.validation import check_rank_argument
from .checkpoint import BackupAndRestore
from ..tensorflow.collectives import allreduce, join
from ..tensorflow.arguments import Average
from ..tensorflow.variable_broadcast import broadcast_variables

__all__ = ["BroadcastGlobalVariablesCallback", "JoinCallback", "MetricAverageCallback",
           "LearningRateWarmupCallback", "LearningRateScheduleCallback", "BackupAndRestore",
           "TimelineCallback", "on_rank"]


def _model_state(model, skip_ids=()):
    """The model's variables and its optimizer's (once built), less those
    whose id is in `skip_ids`."""
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        variables += list(optimizer.variables)
    return [v for v in variables if id(v) not in skip_ids]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from `root_rank`'s model and optimizer state.

    At the start of training it broadcasts `model.variables` (and the
    optimizer's variables, if the optimizer is built already). Keras builds
    the optimizer's slots lazily, in the first training step, so if the
    optimizer was not built at the start, once the first batch is done it
    broadcasts the model's and optimizer's variables again (at the
    beginning of the second batch, or at the end of the epoch if there is
    only one). From then on the model and optimizer variables are the
    root's on every rank; a `DistributedOptimizer` keeps them identical
    afterwards. (After a `BackupAndRestore` listed before it, which builds
    the optimizer and restores every rank's own state, the one broadcast at
    the start is all: a resumed run then goes on as the uninterrupted run
    did.)

    Non-trainable state that each rank updates from its own data (e.g.
    BatchNormalization moving statistics) is only equal at those two
    points.

    Args:
        root_rank: The rank whose values every rank takes. Defaults to 0.
        local_variables: Variables that keep each rank's own value (not
            broadcast), e.g. those of the local layers of a
            `PartialDistributedOptimizer`. Defaults to None (none).
    """

    def __init__(self, root_rank=0, local_variables=None):
        super().__init__()
        self.root_rank = check_rank_argument(root_rank, "root_rank",
                                             "BroadcastGlobalVariablesCallback")
        self._local_ids = {id(v) for v in (local_variables or ())}
        self._after_first_batch = False
        self._batch_started = False

    def broadcast(self):
        """Broadcasts the model's and optimizer's variables now."""
        broadcast_variables(_model_state(self.model, self._local_ids), root_rank=self.root_rank)

    def on_train_begin(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        self.broadcast()
        self._after_first_batch = optimizer is not None and not optimizer.built
        self._batch_started = False

    def _first_batch_done(self):
        if self._after_first_batch and self._batch_started:
            self._after_first_batch = False
            self.broadcast()

    # Not on_train_batch_end: overriding it would make Keras run every
    # batch-end hook synchronously, for the whole fit.
    def on_train_batch_begin(self, batch, logs=None):
        self._first_batch_done()
        self._batch_started = True

    def on_epoch_end(self, epoch, logs=None):
        self._first_batch_done()


class JoinCallback(keras.callbacks.Callback):
    """Lets ranks whose data has different numbers of batches train together.

    At the end of each epoch every rank calls `keras_ddl.join()`. A rank
    that ran out of batches waits there while the others finish their
    epoch: it stands in for their gradient allreduces with zeros, so each
    of those steps averages the gradients of the ranks still training.
    Once every rank has joined, all take the model and optimizer variables
    of the rank that joined last (it applied every step), so the replicas
    start the next epoch identical.

    Put it first in the callback list: callbacks that issue collectives at
    the end of an epoch (`MetricAverageCallback`, checkpoint agreement)
    must run after it. Validation runs before the epoch ends, so it must
    not issue collectives (Keras metrics computed per rank are fine).

    Args:
        local_variables: Variables that keep each rank's own value (not
            broadcast after the join). Defaults to None (none).
    """

    def __init__(self, local_variables=None):
        super().__init__()
        self._local_ids = {id(v) for v in (local_variables or ())}

    def on_epoch_end(self, epoch, logs=None):
        last = join()
        broadcast_variables(_model_state(self.model, self._local_ids), root_rank=last)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class MetricAverageCallback(keras.callbacks.Callback):
    """Averages the epoch-end logs over all ranks, in place.

    At the end of each epoch, every numeric entry of `logs` (`loss`, the
    metrics, `val_*`, ...) becomes the mean of that entry over all ranks,
    so every rank holds the same, global values. Callbacks that come after
    it in the `callbacks` list (and `History`, which Keras appends last) see
    the averaged values: put it BEFORE `ModelCheckpoint(monitor=...)`,
    `EarlyStopping`, `ReduceLROnPlateau`, `CSVLogger`, ... A callback listed
    before it sees this rank's own values.

    The mean over ranks equals the metric over the global data when the
    metric is a mean and every rank saw the same number of samples. One
    float64 allreduce per epoch; every rank must produce the same log keys.
    """

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            logs = {}
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64, shape=[len(keys)])
        averaged = allreduce(values, op=Average, name="keras_ddl.MetricAverageCallback")
        for key, value in zip(keys, averaged.numpy().tolist()):
            logs[key] = value


def _learning_rate_variable(model):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError("keras_ddl: the model has no optimizer; compile it before fit")
    lr = optimizer.learning_rate
    if not isinstance(lr, keras.Variable):
        raise ValueError(
            "keras_ddl: this callback sets the learning rate, but the optimizer's "
            f"learning_rate is {type(getattr(_unwrap(optimizer), '_learning_rate', lr)).__name__} "
            "(a LearningRateSchedule or a callable), which cannot be assigned. Create the "
            "optimizer with a float learning_rate, or drop the callback and use a schedule "
            "such as keras_ddl.schedules.WarmUp.")
    return lr


def _unwrap(optimizer):
    """The optimizer that holds the slots (through DistributedOptimizer and
    LossScaleOptimizer)."""
    seen = set()
    while hasattr(optimizer, "inner_optimizer") and id(optimizer) not in seen:
        seen.add(id(optimizer))
        optimizer = optimizer.inner_optimizer
    return optimizer


def _momentum_buffers(optimizer):
    """Velocity variables whose update has the learning rate inside
    (`v = m*v + lr*g` forms): Keras SGD and keras_ddl LARS."""
    from .optimizers import LARS

    optimizer = _unwrap(optimizer)
    if not optimizer.built or not getattr(optimizer, "momentum", 0):
        return []
    if isinstance(optimizer, keras.optimizers.SGD):
        buffers = getattr(optimizer, "momentums", [])
    elif isinstance(optimizer, LARS):
        buffers = getattr(optimizer, "_velocities", [])
    else:
        return []
    return [b for b in buffers if b is not None]


def set_learning_rate(model, value, momentum_correction=False):
    """Assigns `value` to the model optimizer's learning rate.

    With `momentum_correction`, the velocities of an SGD (momentum) or LARS
    optimizer are multiplied by `new_lr / old_lr`, so that the change of
    rate applies to the next step only (Goyal et al., 2017, section 2.1),
    instead of reaching into the accumulated momentum. Other optimizers
    keep their state (their moments do not contain the rate).
    """
    variable = _learning_rate_variable(model)
    old = float(variable.numpy())
    new = float(np.asarray(value, dtype=variable.dtype))
    if new == old:
        return
    variable.assign(new)
    if momentum_correction and old != 0:
        ratio = new / old
        for buffer in _momentum_buffers(model.optimizer):
            buffer.assign(buffer * ratio)


def _positive_number(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"keras_ddl: `{name}` must be a number {bound}, got {value!r}")
    return value


def _steps_per_epoch(callback, given):
    if given is not None:
        return given
    steps = (callback.params or {}).get("steps")
    if not steps:
        raise ValueError(
            f"keras_ddl: {type(callback).__name__} cannot infer steps_per_epoch (fit does not "
            "know the number of batches per epoch, e.g. for a dataset of unknown length); "
            "pass steps_per_epoch=")
    return steps


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Gradual warmup of the learning rate (Goyal et al., 2017), per batch.

    With `size = keras_ddl.size()` ranks and `steps` batches per epoch, at
    the beginning of batch `b` of epoch `e` (both counted from 0) it sets

    ```python
    progress = min(1, (e + b / steps) / warmup_epochs)
    lr = initial_lr / size * (1 + (size - 1) * progress)
    ```

    so the rate grows linearly from `initial_lr / size` (the single-process
    rate, when `initial_lr` was scaled by the linear scaling rule) at the
    first batch, and at the end of epoch `warmup_epochs - 1` it is set to
    exactly `initial_lr`. After the warmup it no longer touches the rate
    (a `LearningRateScheduleCallback` with `start_epoch=warmup_epochs` can
    take over).

    Args:
        initial_lr: The rate after the warmup (the scaled, large-batch rate).
        warmup_epochs: Number of epochs of warmup (> 0). Defaults to 5.
        steps_per_epoch: Batches per epoch on this rank; `None` takes it from
            `fit` (`params["steps"]`).
        momentum_correction: Rescale SGD/LARS velocities when the rate
            changes (see `set_learning_rate`). Defaults to `True`.
        verbose: If > 0, print a line when the warmup ends.
    """

    def __init__(self, initial_lr, warmup_epochs=5, steps_per_epoch=None,
                 momentum_correction=True, verbose=0):
        super().__init__()
        self.initial_lr = float(_positive_number("initial_lr", initial_lr))
        self.warmup_epochs = _positive_number("warmup_epochs", warmup_epochs)
        if steps_per_epoch is not None:
            _positive_number("steps_per_epoch", steps_per_epoch)
        self.steps_per_epoch = steps_per_epoch
        self.momentum_correction = momentum_correction
        self.verbose = verbose
        self.size = basics.size()
        self._epoch = 0
        self._steps = None

    def learning_rate(self, epoch, batch):
        """The warmup rate at batch `batch` of epoch `epoch`."""
        progress = min(1.0, (epoch + batch / self._steps) / self.warmup_epochs)
        return self.initial_lr / self.size * (1 + (self.size - 1) * progress)

    def on_train_begin(self, logs=None):
        self._steps = _steps_per_epoch(self, self.steps_per_epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch < self.warmup_epochs:
            set_learning_rate(self.model, self.learning_rate(self._epoch, batch),
                              self.momentum_correction)

    def on_epoch_end(self, epoch, logs=None):
        if epoch < self.warmup_epochs <= epoch + 1:
            set_learning_rate(self.model, self.initial_lr, self.momentum_correction)
            if self.verbose:
                print(f"Epoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{self.initial_lr:g}.")


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier` in an epoch range.

    For epochs `start_epoch <= epoch < end_epoch` (no upper bound when
    `end_epoch` is None):

    - `staircase=True`: at the beginning of each such epoch,
      `lr = initial_lr * multiplier(epoch)`;
    - `staircase=False`: at the beginning of each batch `b`,
      `lr = initial_lr * multiplier(epoch + b / steps_per_epoch)`.

    `multiplier` is a number (a constant factor) or a function of the
    (possibly fractional) epoch. Outside the range the rate is left as it
    is. Several of these callbacks with disjoint ranges make a piecewise
    schedule, e.g. Goyal et al.'s 1x / 0.1x / 0.01x / 0.001x at epochs 5
    (after the warmup), 30, 60, 80.

    Args:
        initial_lr: The base rate the multiplier applies to.
        multiplier: A number, or `fn(epoch) -> number`.
        start_epoch: First epoch of the range. Defaults to 0.
        end_epoch: Epoch after the range, or None. Defaults to None.
        staircase: Per epoch (True, default) or per batch (False).
        momentum_correction: Rescale SGD/LARS velocities when the rate
            changes (see `set_learning_rate`). Defaults to `True`.
        steps_per_epoch: Batches per epoch on this rank, used when
            `staircase=False`; `None` takes it from `fit`.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = float(_positive_number("initial_lr", initial_lr, allow_zero=True))
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = float(_positive_number("multiplier", multiplier, allow_zero=True))
            self.multiplier = lambda epoch: factor
        self.start_epoch = _positive_number("start_epoch", start_epoch, allow_zero=True)
        if end_epoch is not None:
            _positive_number("end_epoch", end_epoch)
            if end_epoch <= start_epoch:
                raise ValueError(f"keras_ddl: end_epoch ({end_epoch}) must be greater than "
                                 f"start_epoch ({start_epoch})")
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        if steps_per_epoch is not None:
            _positive_number("steps_per_epoch", steps_per_epoch)
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0
        self._steps = None

    def _active(self, epoch):
        return self.start_epoch <= epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def learning_rate(self, epoch, batch=0):
        """The scheduled rate at batch `batch` of epoch `epoch`."""
        if self.staircase:
            return self.initial_lr * float(self.multiplier(epoch))
        return self.initial_lr * float(self.multiplier(epoch + batch / self._steps))

    def on_train_begin(self, logs=None):
        if not self.staircase:
            self._steps = _steps_per_epoch(self, self.steps_per_epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.staircase and self._active(epoch):
            set_learning_rate(self.model, self.learning_rate(epoch), self.momentum_correction)

    def on_train_batch_begin(self, batch, logs=None):
        if not self.staircase and self._active(self._epoch):
            set_learning_rate(self.model, self.learning_rate(self._epoch, batch),
                              self.momentum_correction)


class TimelineCallback(keras.callbacks.Callback):
    """Marks training steps in the `DDL_TIMELINE` trace.

    Adds an instant event ``"epoch E step S"`` when each training step
    starts (every `every_n_steps`-th step) and ``"epoch E"`` when an epoch
    starts, so the per-tensor spans of the trace (negotiation, copies,
    allreduce phases) can be read step by step in chrome://tracing or
    Perfetto. Rank 0 writes the trace; on the other ranks, or without
    `DDL_TIMELINE`, the marks cost a function call.

    Args:
        every_n_steps: mark one step in this many (at least 1).
    """

    def __init__(self, every_n_steps=1):
        super().__init__()
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) \
                or every_n_steps < 1:
            raise ValueError("keras_ddl: TimelineCallback every_n_steps must be an int >= 1, "
                             f"got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        basics.timeline_mark(f"epoch {epoch}")

    def on_train_batch_begin(self, batch, logs=None):
        if batch % self.every_n_steps == 0:
            basics.timeline_mark(f"epoch {self._epoch} step {batch}")


_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
          "on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end",
          "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
          "on_predict_begin", "on_predict_end", "on_predict_batch_begin",
          "on_predict_batch_end")
# Keras runs batch-end hooks in a background thread unless some callback
# overrides them; these keep the wrapper as neutral as the wrapped callback.
_BATCH_END_HOOKS = ("on_batch_end", "on_train_batch_end", "on_test_batch_end",
                    "on_predict_batch_end")


@private_api.mark_default_hook
def _default_noop(*args, **kwargs):
    return None


class _OnRank(keras.callbacks.Callback):
    """Forwards every hook to `callback` on one rank only (see `on_rank`)."""

    def __init__(self, rank, callback):
        super().__init__()
        self.rank = rank
        self.callback = callback
        self.active = basics.rank() == rank
        self.async_safe = getattr(callback, "async_safe", False)
        for hook in _BATCH_END_HOOKS:
            if not self.active or private_api.is_default_hook(getattr(callback, hook, None)):
                setattr(self, hook, _default_noop)

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def __repr__(self):
        return f"on_rank({self.rank}, {self.callback!r})"


def _forward(hook):
    def forward(self, *args, **kwargs):
        if self.active:
            return getattr(self.callback, hook)(*args, **kwargs)
        return None

    forward.__name__ = hook
    return forward


for _hook in _HOOKS:
    setattr(_OnRank, _hook, _forward(_hook))


def on_rank(rank, callback):
    """Runs `callback` on rank `rank` only.

    ```python
    callbacks.append(ddl.callbacks.on_rank(0, keras.callbacks.ModelCheckpoint(path)))
    ```

    Every hook (`on_train_begin`, `on_epoch_end`, ...) is forwarded to
    `callback` on that rank and ignored on the others; `set_model` and
    `set_params` are forwarded on every rank. Use it for callbacks with
    side effects that one rank should have: checkpoints, TensorBoard,
    CSVLogger, printing. Do not use it for callbacks that change training
    (`EarlyStopping`, `ReduceLROnPlateau`, `LearningRateScheduler`,
    `TerminateOnNaN`): every rank must make the same decision, so run those
    on every rank after a `MetricAverageCallback`. For the progress bar,
    pass `verbose=1 if ddl.rank() == 0 else 0` to `fit`.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < basics.size():
        raise ValueError(f"keras_ddl: rank must be an int in [0, {basics.size()}), got {rank!r}")
    if not isinstance(callback, keras.callbacks.Callback):
        raise TypeError("keras_ddl: on_rank wraps a keras.callbacks.Callback, got "
                        f"{type(callback).__name__}")
    return _OnRank(rank, callback)
