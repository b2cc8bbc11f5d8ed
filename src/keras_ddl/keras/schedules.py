"""Learning-rate schedules for large-batch training.

`WarmUp` wraps any rate (a float or another schedule) with a gradual warmup
(Goyal et al., 2017). The `*WithWarmup` schedules are the usual decays after
such a warmup: polynomial (power 2, as used with LARS by You et al., 2017),
cosine, and Goyal's step schedule (divide by 10 at given boundaries).
`linear_scaling_rule` gives the learning rate for a global batch size.

Every schedule is a `keras.optimizers.schedules.LearningRateSchedule`, computes
with `keras.ops` (so the step may be a tensor inside a `tf.function`),
serializes with `get_config()`/`from_config()` and can be saved with a model.
Steps count optimizer updates, starting at 0 (`optimizer.iterations`).
"""

import math

import keras
from keras import ops

_serializable = keras.saving.register_keras_serializable(package="keras_ddl")
_Schedule = keras.optimizers.schedules.LearningRateSchedule


def _number(name, value, minimum=0.0, strict=False):
    """Returns `value` as a float, or raises a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` must be a number. Received: {name}={value!r}")
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ValueError(f"`{name}` must be {bound}. Received: {name}={value!r}")
    return float(value)


def _steps(name, value, minimum=0):
    """Returns `value` as an int number of steps >= `minimum`."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )
    return value


def linear_scaling_rule(base_lr, global_batch_size, base_batch_size=256):
    """Learning rate for `global_batch_size`: `base_lr * global / base`.

    Goyal et al. (2017): when the minibatch is multiplied by k, multiply the
    learning rate by k. The global batch (summed over all processes) is what
    counts, not the per-process batch.
    """
    base_lr = _number("base_lr", base_lr)
    global_batch_size = _steps("global_batch_size", global_batch_size, 1)
    base_batch_size = _steps("base_batch_size", base_batch_size, 1)
    return base_lr * global_batch_size / base_batch_size


def epochs_to_steps(epochs, steps_per_epoch):
    """Converts an epoch count (or a list of them) to optimizer steps.

    Fractional epochs are allowed; the result is rounded to the nearest step.
    `steps_per_epoch` is `ceil(num_samples / global_batch_size)` with a partial
    last batch, or `num_samples // global_batch_size` without.
    """
    steps_per_epoch = _steps("steps_per_epoch", steps_per_epoch, 1)
    if isinstance(epochs, (list, tuple)):
        return [epochs_to_steps(e, steps_per_epoch) for e in epochs]
    return int(round(_number("epochs", epochs) * steps_per_epoch))


def _serialize_rate(rate):
    if isinstance(rate, _Schedule):
        return keras.optimizers.schedules.serialize(rate)
    return rate


def _deserialize_rate(rate):
    if isinstance(rate, dict):
        return keras.optimizers.schedules.deserialize(rate)
    return rate


def _warmup(step, warmup_steps, initial, target, power, after):
    """`initial -> target` over `warmup_steps` (with `power`), then `after`."""
    if warmup_steps == 0:
        return after
    fraction = ops.minimum(step / warmup_steps, 1.0)
    warm = initial + (target - initial) * ops.power(fraction, power)
    return ops.where(ops.less(step, warmup_steps), warm, after)


@_serializable
class WarmUp(_Schedule):
    """Gradual warmup to a learning rate or to another schedule.

    ```python
    if step < warmup_steps:
        lr = initial_learning_rate + (
            after_warmup(warmup_steps) - initial_learning_rate
        ) * (step / warmup_steps) ** power
    else:
        lr = after_warmup(step)  # the absolute step, not step - warmup_steps
    ```

    Args:
        after_warmup: A float, or a `LearningRateSchedule` to follow after the
            warmup. It sees absolute steps, so a nested decay counts the
            warmup steps too.
        warmup_steps: Integer >= 0. 0 means no warmup.
        initial_learning_rate: The rate at step 0. Defaults to `0.0`.
        power: Exponent of the warmup ramp, > 0; 1 is linear. Defaults to 1.
        name: Optional name of the schedule.
    """

    def __init__(
        self,
        after_warmup,
        warmup_steps,
        initial_learning_rate=0.0,
        power=1.0,
        name=None,
    ):
        super().__init__()
        if not isinstance(after_warmup, _Schedule):
            after_warmup = _number("after_warmup", after_warmup)
        self.after_warmup = after_warmup
        self.warmup_steps = _steps("warmup_steps", warmup_steps)
        self.initial_learning_rate = _number(
            "initial_learning_rate", initial_learning_rate
        )
        self.power = _number("power", power, strict=True)
        self.name = name

    def _after(self, step):
        if isinstance(self.after_warmup, _Schedule):
            return ops.cast(self.after_warmup(step), "float32")
        return ops.full_like(step, self.after_warmup, "float32")

    def __call__(self, step):
        step = ops.cast(step, "float32")
        target = self._after(ops.convert_to_tensor(self.warmup_steps, "float32"))
        return _warmup(
            step,
            self.warmup_steps,
            self.initial_learning_rate,
            target,
            self.power,
            self._after(step),
        )

    def get_config(self):
        return {
            "after_warmup": _serialize_rate(self.after_warmup),
            "warmup_steps": self.warmup_steps,
            "initial_learning_rate": self.initial_learning_rate,
            "power": self.power,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["after_warmup"] = _deserialize_rate(config["after_warmup"])
        return cls(**config)


class _PeakWithWarmup(_Schedule):
    """Linear warmup to `peak_learning_rate`, then `_after_warmup(step)`."""

    def __init__(self, peak_learning_rate, warmup_steps, warmup_initial_learning_rate, name):
        super().__init__()
        self.peak_learning_rate = _number("peak_learning_rate", peak_learning_rate)
        self.warmup_steps = _steps("warmup_steps", warmup_steps)
        self.warmup_initial_learning_rate = _number(
            "warmup_initial_learning_rate", warmup_initial_learning_rate
        )
        self.name = name

    def _after_warmup(self, step):
        raise NotImplementedError

    def __call__(self, step):
        step = ops.cast(step, "float32")
        return _warmup(
            step,
            self.warmup_steps,
            self.warmup_initial_learning_rate,
            self.peak_learning_rate,
            1.0,
            self._after_warmup(step),
        )

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "warmup_initial_learning_rate": self.warmup_initial_learning_rate,
            "name": self.name,
        }


class _DecayWithWarmup(_PeakWithWarmup):
    """Linear warmup to `peak_learning_rate`, then `_decay(fraction)`.

    `fraction` runs from 0 at the end of the warmup to 1 at `total_steps`
    and stays at 1 afterwards.
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps, warmup_initial_learning_rate,
                 name):
        super().__init__(peak_learning_rate, warmup_steps, warmup_initial_learning_rate, name)
        self.total_steps = _steps("total_steps", total_steps, 1)
        if self.total_steps <= self.warmup_steps:
            raise ValueError(
                "`total_steps` must be greater than `warmup_steps`. Received: "
                f"total_steps={total_steps}, warmup_steps={warmup_steps}"
            )

    def _decay(self, step, fraction):
        raise NotImplementedError

    def _after_warmup(self, step):
        decay_steps = float(self.total_steps - self.warmup_steps)
        fraction = ops.clip((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        return self._decay(step, fraction)

    def get_config(self):
        config = super().get_config()
        config["total_steps"] = self.total_steps
        return config


@_serializable
class PolynomialDecayWithWarmup(_DecayWithWarmup):
    """Linear warmup, then polynomial decay (You et al. use power 2 with LARS).

    ```python
    if step < warmup_steps:  # linear warmup
        lr = warmup_initial_learning_rate + (
            peak_learning_rate - warmup_initial_learning_rate
        ) * step / warmup_steps
    else:
        fraction = min(step - warmup_steps, total_steps - warmup_steps) / (
            total_steps - warmup_steps
        )
        lr = (peak_learning_rate - end_learning_rate) * (1 - fraction) ** power
        lr += end_learning_rate
    ```

    Args:
        peak_learning_rate: Rate at the end of the warmup.
        total_steps: Steps of the whole run, warmup included (> warmup_steps).
        warmup_steps: Integer >= 0. Defaults to 0.
        end_learning_rate: Rate from `total_steps` on. Defaults to `0.0`.
        power: Decay exponent, > 0. Defaults to `2.0`.
        warmup_initial_learning_rate: Rate at step 0. Defaults to `0.0`.
        name: Optional name of the schedule.
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=0, end_learning_rate=0.0,
                 power=2.0, warmup_initial_learning_rate=0.0, name=None):
        # The warmup and the decay's span are the base class's; only the
        # decay's own arguments are read here.
        super().__init__(peak_learning_rate, total_steps, warmup_steps,
                         warmup_initial_learning_rate, name)
        self.end_learning_rate = _number("end_learning_rate", end_learning_rate)
        self.power = _number("power", power, strict=True)

    def _decay(self, step, fraction):
        span = self.peak_learning_rate - self.end_learning_rate
        return span * ops.power(1.0 - fraction, self.power) + self.end_learning_rate

    def get_config(self):
        config = super().get_config()
        config.update(
            {"end_learning_rate": self.end_learning_rate, "power": self.power}
        )
        return config


@_serializable
class CosineDecayWithWarmup(_DecayWithWarmup):
    """Linear warmup, then cosine decay down to `alpha * peak_learning_rate`.

    ```python
    if step < warmup_steps:  # linear warmup, as in PolynomialDecayWithWarmup
        ...
    else:
        fraction = min(step - warmup_steps, total_steps - warmup_steps) / (
            total_steps - warmup_steps
        )
        cosine = 0.5 * (1 + cos(pi * fraction))
        lr = peak_learning_rate * ((1 - alpha) * cosine + alpha)
    ```

    Args:
        peak_learning_rate: Rate at the end of the warmup.
        total_steps: Steps of the whole run, warmup included (> warmup_steps).
        warmup_steps: Integer >= 0. Defaults to 0.
        alpha: Final rate as a fraction of the peak, in [0, 1]. Defaults to 0.
        warmup_initial_learning_rate: Rate at step 0. Defaults to `0.0`.
        name: Optional name of the schedule.
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=0, alpha=0.0,
                 warmup_initial_learning_rate=0.0, name=None):
        super().__init__(peak_learning_rate, total_steps, warmup_steps,
                         warmup_initial_learning_rate, name)
        self.alpha = _number("alpha", alpha)
        if self.alpha > 1:
            raise ValueError(f"`alpha` must be <= 1. Received: alpha={alpha!r}")

    def _decay(self, step, fraction):
        cosine = 0.5 * (1.0 + ops.cos(math.pi * fraction))
        return self.peak_learning_rate * ((1.0 - self.alpha) * cosine + self.alpha)

    def get_config(self):
        config = super().get_config()
        config["alpha"] = self.alpha
        return config


@_serializable
class StepDecayWithWarmup(_PeakWithWarmup):
    """Goyal et al.'s schedule: linear warmup, then divide by 10 at boundaries.

    ```python
    if step < warmup_steps:  # linear warmup, as in PolynomialDecayWithWarmup
        ...
    else:
        lr = peak_learning_rate * factor ** (number of boundaries <= step)
    ```

    Boundaries are absolute steps; use `epochs_to_steps` to give them in
    epochs, e.g. Goyal et al.'s ImageNet recipe at global batch `kn`:

    ```python
    steps_per_epoch = 1_281_167 // kn
    StepDecayWithWarmup(
        peak_learning_rate=linear_scaling_rule(0.1, kn),
        boundaries=epochs_to_steps([30, 60, 80], steps_per_epoch),
        warmup_steps=epochs_to_steps(5, steps_per_epoch),
        warmup_initial_learning_rate=0.1,
    )
    ```

    Args:
        peak_learning_rate: Rate at the end of the warmup.
        boundaries: Strictly increasing integer steps, each >= warmup_steps.
        warmup_steps: Integer >= 0. Defaults to 0.
        factor: Multiplier applied at each boundary, in (0, 1]. Defaults to
            `0.1`.
        warmup_initial_learning_rate: Rate at step 0. Defaults to `0.0`.
        name: Optional name of the schedule.
    """

    def __init__(
        self,
        peak_learning_rate,
        boundaries,
        warmup_steps=0,
        factor=0.1,
        warmup_initial_learning_rate=0.0,
        name=None,
    ):
        super().__init__(peak_learning_rate, warmup_steps, warmup_initial_learning_rate, name)
        if not isinstance(boundaries, (list, tuple)):
            raise ValueError(
                "`boundaries` must be a list of steps. "
                f"Received: boundaries={boundaries!r}"
            )
        self.boundaries = [_steps("boundaries", b) for b in boundaries]
        if any(b <= a for a, b in zip(self.boundaries, self.boundaries[1:])):
            raise ValueError(
                "`boundaries` must be strictly increasing. "
                f"Received: boundaries={boundaries!r}"
            )
        if self.boundaries and self.boundaries[0] < self.warmup_steps:
            raise ValueError(
                "`boundaries` must all be >= `warmup_steps`. Received: "
                f"boundaries={boundaries!r}, warmup_steps={warmup_steps}"
            )
        self.factor = _number("factor", factor, strict=True)
        if self.factor > 1:
            raise ValueError(f"`factor` must be <= 1. Received: factor={factor!r}")

    def _after_warmup(self, step):
        passed = ops.convert_to_tensor(0.0, "float32")
        for boundary in self.boundaries:
            passed = passed + ops.cast(ops.greater_equal(step, boundary), "float32")
        return self.peak_learning_rate * ops.power(self.factor, passed)

    def get_config(self):
        config = super().get_config()
        config.update({"boundaries": list(self.boundaries), "factor": self.factor})
        return config
