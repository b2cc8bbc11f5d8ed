"""Schedules against their formulas (numpy), nesting, serialization, errors."""

import json
import math

import numpy as np
import pytest

import keras
import tensorflow as tf

from keras_ddl import schedules

STEPS = np.arange(0, 260)


def values(schedule, steps=STEPS):
    """The schedule at every step, in one vectorized call (all math is
    elementwise), checked against scalar calls at a few steps."""
    out = np.asarray(schedule(np.asarray(steps, "int64")), np.float64)
    for i in (0, len(steps) // 3, len(steps) - 1):
        assert float(schedule(int(steps[i]))) == pytest.approx(out[i], rel=1e-6)
    return out


def ramp(steps, warmup_steps, initial, target, power=1.0):
    return initial + (target - initial) * (steps / warmup_steps) ** power


def cosine(steps, peak, decay_steps, alpha=0.0, offset=0):
    fraction = np.clip((steps - offset) / decay_steps, 0.0, 1.0)
    return peak * ((1 - alpha) * 0.5 * (1 + np.cos(np.pi * fraction)) + alpha)


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_warmup_to_a_constant(power):
    sched = schedules.WarmUp(
        0.8, warmup_steps=40, initial_learning_rate=0.1, power=power
    )
    expected = np.where(STEPS < 40, ramp(STEPS, 40, 0.1, 0.8, power), 0.8)
    np.testing.assert_allclose(values(sched), expected, rtol=1e-6)
    assert float(sched(0)) == pytest.approx(0.1)
    assert float(sched(20)) == pytest.approx(0.1 + 0.7 * 0.5**power)


def test_warmup_of_cosine_decay_uses_absolute_steps():
    inner = keras.optimizers.schedules.CosineDecay(1.5, decay_steps=200, alpha=0.1)
    sched = schedules.WarmUp(inner, warmup_steps=30)
    target = cosine(30, 1.5, 200, 0.1)
    expected = np.where(
        STEPS < 30, ramp(STEPS, 30, 0.0, target), cosine(STEPS, 1.5, 200, 0.1)
    )
    np.testing.assert_allclose(values(sched), expected, rtol=1e-5, atol=1e-7)
    # Continuous at the end of the warmup, and the decay was not shifted.
    assert float(sched(29)) == pytest.approx(target * 29 / 30, rel=1e-5)
    assert float(sched(200)) == pytest.approx(0.15, rel=1e-5)


def test_warmup_of_a_warmup_schedule_nests():
    inner = schedules.PolynomialDecayWithWarmup(2.0, total_steps=100, warmup_steps=50)
    outer = schedules.WarmUp(inner, warmup_steps=20, initial_learning_rate=0.5)
    # inner(20) = 2.0 * 20 / 50 = 0.8 is the target of the outer warmup.
    expected = np.where(STEPS < 20, ramp(STEPS, 20, 0.5, 0.8), values(inner))
    np.testing.assert_allclose(values(outer), expected, rtol=1e-6)


def test_zero_warmup_steps_is_the_wrapped_rate():
    inner = keras.optimizers.schedules.ExponentialDecay(1.0, 10, 0.5)
    np.testing.assert_allclose(
        values(schedules.WarmUp(inner, 0)), 0.5 ** (STEPS / 10), rtol=1e-5
    )
    np.testing.assert_allclose(values(schedules.WarmUp(0.3, 0)), 0.3, rtol=1e-6)


@pytest.mark.parametrize("warmup", [0, 25])
@pytest.mark.parametrize("power", [2.0, 1.0])
def test_polynomial_decay_with_warmup(warmup, power):
    sched = schedules.PolynomialDecayWithWarmup(
        3.0,
        total_steps=200,
        warmup_steps=warmup,
        end_learning_rate=0.01,
        power=power,
        warmup_initial_learning_rate=0.2,
    )
    decay_steps = 200 - warmup
    fraction = np.clip((STEPS - warmup) / decay_steps, 0, 1)
    decayed = (3.0 - 0.01) * (1 - fraction) ** power + 0.01
    expected = (
        decayed
        if warmup == 0
        else np.where(STEPS < warmup, ramp(STEPS, max(warmup, 1), 0.2, 3.0), decayed)
    )
    np.testing.assert_allclose(values(sched), expected, rtol=1e-5, atol=1e-7)
    assert float(sched(warmup)) == pytest.approx(3.0)
    assert float(sched(250)) == pytest.approx(0.01)


def test_cosine_decay_with_warmup():
    sched = schedules.CosineDecayWithWarmup(
        1.2, total_steps=220, warmup_steps=20, alpha=0.05
    )
    expected = np.where(
        STEPS < 20, ramp(STEPS, 20, 0.0, 1.2), cosine(STEPS, 1.2, 200, 0.05, offset=20)
    )
    np.testing.assert_allclose(values(sched), expected, rtol=1e-5, atol=1e-7)
    assert float(sched(120)) == pytest.approx(1.2 * (0.95 * 0.5 + 0.05), rel=1e-5)


def test_goyal_step_schedule():
    # Goyal et al.: lr 0.1 * kn / 256, 5 warmup epochs from 0.1, /10 at 30, 60, 80.
    steps_per_epoch = 3
    peak = schedules.linear_scaling_rule(0.1, 8192)
    sched = schedules.StepDecayWithWarmup(
        peak,
        boundaries=schedules.epochs_to_steps([30, 60, 80], steps_per_epoch),
        warmup_steps=schedules.epochs_to_steps(5, steps_per_epoch),
        warmup_initial_learning_rate=0.1,
    )
    assert sched.boundaries == [90, 180, 240] and sched.warmup_steps == 15
    passed = (STEPS >= 90).astype(int) + (STEPS >= 180) + (STEPS >= 240)
    expected = np.where(STEPS < 15, ramp(STEPS, 15, 0.1, 3.2), 3.2 * 0.1**passed)
    np.testing.assert_allclose(values(sched), expected, rtol=1e-5)
    assert [float(sched(s)) for s in (89, 90, 179, 180, 259)] == pytest.approx(
        [3.2, 0.32, 0.32, 0.032, 0.0032], rel=1e-5
    )


def test_linear_scaling_rule_and_epochs_to_steps():
    assert schedules.linear_scaling_rule(0.1, 8192) == pytest.approx(3.2)
    assert schedules.linear_scaling_rule(0.1, 256) == pytest.approx(0.1)
    assert schedules.linear_scaling_rule(0.2, 64, base_batch_size=32) == pytest.approx(
        0.4
    )
    assert schedules.epochs_to_steps(2.5, 100) == 250
    assert schedules.epochs_to_steps([1, 0.5, 3], 7) == [7, 4, 21]


ALL = [
    schedules.WarmUp(0.5, 10, initial_learning_rate=0.05, power=2.0, name="w"),
    schedules.WarmUp(keras.optimizers.schedules.CosineDecay(1.0, 200), 30),
    schedules.WarmUp(schedules.CosineDecayWithWarmup(1.0, 200, 10, alpha=0.1), 30),
    schedules.PolynomialDecayWithWarmup(2.0, 150, 15, end_learning_rate=0.001),
    schedules.CosineDecayWithWarmup(0.9, 120, 12, alpha=0.2),
    schedules.StepDecayWithWarmup(0.4, [50, 100], 10, factor=0.5),
]


@pytest.mark.parametrize("sched", ALL, ids=lambda s: type(s).__name__)
def test_serialization_round_trip(sched):
    config = keras.optimizers.schedules.serialize(sched)
    restored = keras.optimizers.schedules.deserialize(json.loads(json.dumps(config)))
    assert type(restored) is type(sched)
    assert restored.get_config() == sched.get_config()
    np.testing.assert_allclose(values(restored), values(sched), rtol=1e-7)
    generic = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(sched)
    )
    np.testing.assert_allclose(values(generic), values(sched), rtol=1e-7)


@pytest.mark.parametrize("sched", ALL, ids=lambda s: type(s).__name__)
def test_tensor_step_inside_tf_function_and_optimizer(sched):
    fn = tf.function(lambda step: sched(step))
    for step in (0, 9, 10, 77, 140, 300):
        assert float(fn(tf.constant(step, tf.int64))) == pytest.approx(
            float(sched(step)), rel=1e-6
        )
    var = keras.Variable(np.zeros(2, "float32"))
    opt = keras.optimizers.SGD(learning_rate=sched)
    for _ in range(12):
        opt.apply_gradients([(tf.ones(2), var)])
    # SGD without momentum: w = -sum of the rates at steps 0..11.
    expected = -sum(float(sched(s)) for s in range(12))
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-5)


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: schedules.WarmUp(0.1, -1), "warmup_steps"),
        (lambda: schedules.WarmUp(0.1, 2.5), "warmup_steps"),
        (lambda: schedules.WarmUp("fast", 10), "after_warmup"),
        (lambda: schedules.WarmUp(-0.1, 10), "after_warmup"),
        (
            lambda: schedules.WarmUp(0.1, 10, initial_learning_rate=-1.0),
            "initial_learning_rate",
        ),
        (lambda: schedules.WarmUp(0.1, 10, power=0.0), "power"),
        (lambda: schedules.PolynomialDecayWithWarmup(1.0, 10, 10), "total_steps"),
        (lambda: schedules.PolynomialDecayWithWarmup(1.0, 0), "total_steps"),
        (lambda: schedules.PolynomialDecayWithWarmup(1.0, 100, -5), "warmup_steps"),
        (lambda: schedules.PolynomialDecayWithWarmup(-1.0, 100), "peak_learning_rate"),
        (lambda: schedules.PolynomialDecayWithWarmup(1.0, 100, power=-2), "power"),
        (lambda: schedules.CosineDecayWithWarmup(1.0, 100, alpha=1.5), "alpha"),
        (
            lambda: schedules.CosineDecayWithWarmup(
                1.0, 100, 5, warmup_initial_learning_rate=math.nan
            ),
            "warmup_initial_learning_rate",
        ),
        (lambda: schedules.StepDecayWithWarmup(1.0, [30, 20]), "boundaries"),
        (
            lambda: schedules.StepDecayWithWarmup(1.0, [5, 20], warmup_steps=10),
            "boundaries",
        ),
        (lambda: schedules.StepDecayWithWarmup(1.0, 30), "boundaries"),
        (lambda: schedules.StepDecayWithWarmup(1.0, [30], factor=0.0), "factor"),
        (lambda: schedules.StepDecayWithWarmup(1.0, [30], factor=10.0), "factor"),
        (lambda: schedules.linear_scaling_rule(0.1, 0), "global_batch_size"),
        (
            lambda: schedules.linear_scaling_rule(0.1, 512, base_batch_size=-256),
            "base_batch_size",
        ),
        (lambda: schedules.linear_scaling_rule(-0.1, 512), "base_lr"),
        (lambda: schedules.epochs_to_steps(5, 0), "steps_per_epoch"),
        (lambda: schedules.epochs_to_steps(-1, 10), "epochs"),
    ],
)
def test_bad_arguments_name_the_argument(make, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        make()
