"""LARS: layer-wise adaptive rate scaling, as a Keras 3 optimizer."""

import re

import keras
from keras import ops

# Biases and the parameters of normalization layers (their trainable
# variables are `gamma`/`beta`, or `scale` for RMSNormalization, which the
# layer-name pattern catches).
DEFAULT_EXCLUDES = ("bias", "gamma", "beta", r"(batch|layer|group|rms)_norm")


def _compile_patterns(patterns, argument):
    if isinstance(patterns, str):
        raise ValueError(
            f"`{argument}` must be a list of name patterns, not a string. "
            f"Received: {argument}={patterns!r}"
        )
    try:
        return [re.compile(p) for p in patterns]
    except (TypeError, re.error) as e:
        raise ValueError(
            f"`{argument}` must be a list of regular expressions. "
            f"Received: {argument}={patterns!r} ({e})"
        ) from None


@keras.saving.register_keras_serializable(package="keras_ddl")
class LARS(keras.optimizers.Optimizer):
    """Optimizer that implements LARS (layer-wise adaptive rate scaling).

    Each variable `w` (a "layer" in the paper) gets its own trust ratio, so
    that its step is proportional to its own norm rather than to the norm of
    its gradient. This keeps training stable at the very large learning rates
    that large global batches call for. With gradient `g`, global learning
    rate `lr` and weight decay `wd`, per variable:

    ```python
    trust = eeta * norm(w) / (norm(g) + wd * norm(w) + epsilon)
    # trust = 1 where norm(w) == 0 or the denominator is 0, or if `w` is
    # excluded from layer adaptation (opt-in, see below).
    v = momentum * v + lr * trust * (g + wd * w)
    w = w - v
    ```

    With `nesterov=True` the last line becomes
    `w = w - (momentum * v + lr * trust * (g + wd * w))`, `v` being the
    updated velocity. Variables excluded from weight decay use `wd = 0`.
    The velocity has the dtype of the variable it belongs to, which is
    float32 under a `mixed_float16`/`mixed_bfloat16` policy.

    As in Algorithm 1 of the paper, every variable is adapted by default,
    biases and normalization parameters included. A zero-initialized
    variable (a bias, a BatchNormalization `beta`) therefore takes one
    unadapted step `lr * g` while its norm is 0, then adaptive ones. A
    zero gradient does not make the trust ratio 1: with weight decay the
    denominator is still `wd * norm(w)`, so `trust = eeta / wd` (with
    `epsilon = 0`) and the velocity gains `lr * eeta * w`. Without weight
    decay a zero gradient adds nothing to the velocity.

    Exclusions are lists of regular expressions searched (`re.search`) in each
    variable's `path` (e.g. `"sequential/dense/bias"`) and in its `name`. By
    default biases and normalization parameters are excluded from weight
    decay (not from layer adaptation): the patterns `"bias"`, `"gamma"`,
    `"beta"` and `"(batch|layer|group|rms)_norm"`. Since these are substring
    matches, a layer whose own name contains one of them (say `"alphabeta"`)
    is excluded entirely; pass explicit lists to control this. Variables
    passed to the inherited `exclude_from_weight_decay()` method are excluded
    from weight decay too.

    Args:
        learning_rate: A float, a
            `keras.optimizers.schedules.LearningRateSchedule` instance, or a
            callable that takes no arguments and returns the value to use.
            The global learning rate. Defaults to `0.01`.
        momentum: A float in `[0, 1]`. Defaults to `0.9`.
        weight_decay: A float `>= 0`, the L2 coefficient added to the gradient
            inside the update (not decoupled). Defaults to `1e-4`.
        eeta: A float `>= 0`, the trust coefficient. Defaults to `0.001`.
        epsilon: A float `>= 0` added to the trust ratio's denominator.
            Defaults to `0.0`.
        nesterov: Whether to use Nesterov momentum. Defaults to `False`.
        exclude_from_weight_decay: A list of name patterns, or `None` for the
            default (biases and normalization parameters). `[]` excludes
            nothing.
        exclude_from_layer_adaptation: A list of name patterns for variables
            that skip the trust ratio (`trust = 1`, the MLPerf reference's
            meaning: such a variable takes `lr * g`, plus `lr * wd * w` if
            it is decayed), or `None` (the default) or `[]` to adapt every
            variable. Dangerous at LARS-scale rates: a LARS learning rate is
            chosen for adapted steps, which the trust ratio scales down by
            about `eeta * norm(w) / norm(g)`, so it is far above an SGD rate
            (10 per 256 images against SGD's 0.1 in this project's study,
            `examples/large_batch_study.py`), and an excluded variable takes
            it raw. In that study, excluding biases and BatchNormalization
            parameters from adaptation made the run at 64x the base batch
            (peak rate 80) diverge; adapting them let it train.
        name: String, the name of the optimizer. Defaults to `"lars"`.
        **kwargs: The other keyword arguments of `keras.optimizers.Optimizer`
            (`clipnorm`, `global_clipnorm`, `use_ema`,
            `gradient_accumulation_steps`, `loss_scale_factor`, ...).

    References:
        - [You, Gitman & Ginsburg, 2017](https://arxiv.org/abs/1708.03888),
          Algorithm 1.
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum=0.9,
        weight_decay=1e-4,
        eeta=0.001,
        epsilon=0.0,
        nesterov=False,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        name="lars",
        **kwargs,
    ):
        if weight_decay is None:
            weight_decay = 0.0
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            name=name,
            **kwargs,
        )
        for arg, value, upper in (
            ("momentum", momentum, 1.0),
            ("weight_decay", weight_decay, None),
            ("eeta", eeta, None),
            ("epsilon", epsilon, None),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value < 0
                or (upper is not None and value > upper)
            ):
                bounds = "in [0, 1]" if upper else ">= 0"
                raise ValueError(
                    f"`{arg}` must be a float {bounds}. Received: {arg}={value!r}"
                )
        self.momentum = float(momentum)
        self.eeta = float(eeta)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self.exclude_from_weight_decay_patterns = exclude_from_weight_decay
        self.exclude_from_layer_adaptation_patterns = exclude_from_layer_adaptation
        self._wd_patterns = _compile_patterns(
            (
                DEFAULT_EXCLUDES
                if exclude_from_weight_decay is None
                else exclude_from_weight_decay
            ),
            "exclude_from_weight_decay",
        )
        self._adapt_patterns = _compile_patterns(
            (
                []
                if exclude_from_layer_adaptation is None
                else exclude_from_layer_adaptation
            ),
            "exclude_from_layer_adaptation",
        )

    @staticmethod
    def _matches(variable, patterns):
        names = [str(getattr(variable, "path", "")), str(variable.name)]
        return any(p.search(n) for p in patterns for n in names)

    def build(self, var_list):
        """Create one velocity per variable and fix its exclusions."""
        if self.built:
            return
        super().build(var_list)
        self._velocities = self.add_optimizer_variables(var_list, "velocity")
        # Decided once, on the Keras variables (which carry `path`), and
        # looked up by index in `update_step`.
        self._decays = [
            self._use_weight_decay(v) and not self._matches(v, self._wd_patterns)
            for v in var_list
        ]
        self._adapts = [not self._matches(v, self._adapt_patterns) for v in var_list]

    def _apply_weight_decay(self, variables):
        # Weight decay is part of the LARS update itself (coupled, and scaled
        # by the trust ratio): the base class must not apply it again.
        return

    def update_step(self, gradient, variable, learning_rate):
        """Update step given gradient and the associated model variable."""
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        g = ops.cast(gradient, dtype)
        wd = ops.cast(self.weight_decay if self._decays[index] else 0.0, dtype)
        momentum = ops.cast(self.momentum, dtype)
        v = self._velocities[index]

        if self._adapts[index]:
            w_norm = ops.sqrt(ops.sum(ops.square(variable)))
            g_norm = ops.sqrt(ops.sum(ops.square(g)))
            denominator = g_norm + wd * w_norm + ops.cast(self.epsilon, dtype)
            # trust = 1 where norm(w) == 0 or denominator == 0. Branch-free;
            # the unselected branch must not produce inf/nan either.
            adapt = ops.logical_and(
                ops.greater(w_norm, 0), ops.greater(denominator, 0)
            )
            safe = ops.where(adapt, denominator, 1)
            trust = ops.where(
                adapt, ops.cast(self.eeta, dtype) * w_norm / safe, 1
            )
        else:
            trust = ops.cast(1.0, dtype)

        scaled = lr * trust * (g + wd * variable)
        v_new = momentum * v + scaled
        self.assign(v, v_new)
        if self.nesterov:
            self.assign_sub(variable, momentum * v_new + scaled)
        else:
            self.assign_sub(variable, v_new)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "eeta": self.eeta,
                "epsilon": self.epsilon,
                "nesterov": self.nesterov,
                "exclude_from_weight_decay": _as_list(
                    self.exclude_from_weight_decay_patterns
                ),
                "exclude_from_layer_adaptation": _as_list(
                    self.exclude_from_layer_adaptation_patterns
                ),
            }
        )
        return config


def _as_list(patterns):
    if patterns is None:
        return None
    return [getattr(p, "pattern", p) for p in patterns]
