"""LARS against a numpy reference of its update rule (the docstring of
keras_ddl/keras/optimizers/lars.py), and in real use."""

import copy

import numpy as np
import pytest

import keras
import tensorflow as tf

from keras_ddl import schedules
from keras_ddl.optimizers import LARS


def reference_step(w, g, v, lr, momentum, wd, eeta, epsilon, nesterov, adapt):
    """One LARS step (the rule in keras_ddl/keras/optimizers/lars.py), in
    float64. Returns (new w, new v)."""
    w, g, v = (np.asarray(a, np.float64) for a in (w, g, v))
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    denominator = g_norm + wd * w_norm + epsilon
    trust = 1.0
    if adapt and w_norm > 0 and denominator > 0:
        trust = eeta * w_norm / denominator
    scaled = lr * trust * (g + wd * w)
    v = momentum * v + scaled
    w = w - (momentum * v + scaled if nesterov else v)
    return w, v


def velocity(opt, variable):
    return opt._velocities[opt._get_variable_index(variable)].numpy()


def test_golden_values_one_step():
    # ||w|| = 5, ||g|| = 1: trust = 0.02 * 5 / (1 + 0.01 * 5) = 0.1 / 1.05 and
    # lr * trust * (g + wd * w) = 0.5 / 10.5 * [0.63, 0.84] = [0.03, 0.04].
    for nesterov, expected in ((False, [2.97, 3.96]), (True, [2.943, 3.924])):
        w = keras.Variable(np.array([3.0, 4.0], "float32"), name="kernel")
        opt = LARS(0.5, momentum=0.9, weight_decay=0.01, eeta=0.02, nesterov=nesterov)
        opt.apply_gradients([(tf.constant([0.6, 0.8]), w)])
        np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)
        np.testing.assert_allclose(velocity(opt, w), [0.03, 0.04], rtol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 0.05])
@pytest.mark.parametrize("graph", [False, True])
def test_matches_numpy_reference_over_steps(nesterov, epsilon, graph):
    rng = np.random.default_rng(0)
    hp = dict(momentum=0.9, wd=0.01, eeta=0.02, epsilon=epsilon, nesterov=nesterov)
    lr = 0.7
    init = {
        "kernel": rng.normal(size=(4, 3)),  # decayed and adapted
        "bias": rng.normal(size=(3,)),  # adapted, not decayed, by default
        "zero_kernel": np.zeros((5,)),  # ||w|| = 0 at the first step
        "zero_bias": np.zeros((3,)),  # the same, without weight decay
        "still_kernel": rng.normal(size=(2, 2)),  # zero gradients: eeta / wd
        "still_bias": rng.normal(size=(2,)),  # zero gradients, denominator 0
    }
    variables = [keras.Variable(v.astype("float32"), name=k) for k, v in init.items()]
    opt = LARS(
        lr,
        momentum=hp["momentum"],
        weight_decay=hp["wd"],
        eeta=hp["eeta"],
        epsilon=epsilon,
        nesterov=nesterov,
    )
    apply = opt.apply_gradients
    if graph:
        apply = tf.function(lambda grads: opt.apply_gradients(zip(grads, variables)))
    ref_w = {k: v.copy() for k, v in init.items()}
    ref_v = {k: np.zeros_like(v) for k, v in init.items()}
    for step in range(5):
        grads = {k: rng.normal(size=v.shape) for k, v in init.items()}
        grads["still_kernel"] = np.zeros((2, 2))
        grads["still_bias"] = np.zeros((2,))
        if step == 2:
            grads["kernel"] = np.zeros((4, 3))
        tf_grads = [tf.constant(grads[k], tf.float32) for k in init]
        if graph:
            apply(tf_grads)
        else:
            apply(zip(tf_grads, variables))
        for name in init:
            decayed = "bias" not in name
            ref_w[name], ref_v[name] = reference_step(
                ref_w[name],
                np.float32(grads[name]),
                ref_v[name],
                lr,
                hp["momentum"],
                hp["wd"] if decayed else 0.0,
                hp["eeta"],
                epsilon,
                nesterov,
                adapt=True,
            )
        for name, var in zip(init, variables):
            np.testing.assert_allclose(var.numpy(), ref_w[name], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(
                velocity(opt, var), ref_v[name], rtol=1e-6, atol=1e-6
            )
    # The trust ratio really acted, on the bias too: unadapted steps
    # (lr * g, lr = 0.7, g ~ N(0, 1), 5 steps with momentum) would move the
    # bias by more than 10.
    assert np.abs(variables[0].numpy() - init["kernel"]).max() < 0.2
    assert np.abs(variables[1].numpy() - init["bias"]).max() < 1.0
    assert np.array_equal(variables[5].numpy(), np.float32(init["still_bias"]))


def test_zero_initialized_bias_takes_a_full_first_step_then_adaptive_ones():
    # Default exclusions: the bias is not decayed but is adapted.
    b = keras.Variable(np.zeros(2, "float32"), name="bias")
    w = keras.Variable(np.array([3.0, 4.0], "float32"), name="kernel")
    opt = LARS(0.5, momentum=0.9, weight_decay=0.01, eeta=0.02)
    g = tf.constant([0.6, 0.8])
    opt.apply_gradients([(g, b), (g, w)])
    # ||b|| = 0: trust = 1, v = lr * g = [0.3, 0.4].
    np.testing.assert_allclose(velocity(opt, b), [0.3, 0.4], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), [-0.3, -0.4], rtol=1e-6)
    # The kernel, decayed and adapted, as in test_golden_values_one_step.
    np.testing.assert_allclose(w.numpy(), [2.97, 3.96], rtol=1e-6)
    opt.apply_gradients([(g, b), (g, w)])
    # ||b|| = 0.5, ||g|| = 1, wd = 0: trust = 0.02 * 0.5 / 1 = 0.01, so
    # v = 0.9 * [0.3, 0.4] + 0.5 * 0.01 * [0.6, 0.8] = [0.273, 0.364].
    # (Unadapted, the step would add [0.3, 0.4] instead of [0.003, 0.004].)
    np.testing.assert_allclose(velocity(opt, b), [0.273, 0.364], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), [-0.573, -0.764], rtol=1e-6)


def test_zero_gradient_with_weight_decay_gets_eeta_over_wd():
    w = keras.Variable(np.array([3.0, 4.0], "float32"), name="kernel")
    b = keras.Variable(np.array([1.0, 2.0], "float32"), name="bias")
    z = keras.Variable(np.zeros(2, "float32"), name="other_kernel")
    opt = LARS(0.5, momentum=0.9, weight_decay=0.1, eeta=0.001)
    opt.apply_gradients([(tf.zeros(2), w), (tf.zeros(2), b), (tf.zeros(2), z)])
    # g = 0: trust = eeta * 5 / (0 + 0.1 * 5) = eeta / wd = 0.01 (not 1), and
    # v = lr * trust * wd * w = lr * eeta * w = 0.0005 * [3, 4].
    np.testing.assert_allclose(velocity(opt, w), [0.0015, 0.002], rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), [2.9985, 3.998], rtol=1e-6)
    # Not decayed, g = 0: the denominator is 0, trust = 1, and no step.
    # w = 0 and g = 0: trust = 1, no step. Nothing becomes inf or nan.
    np.testing.assert_array_equal(b.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(z.numpy(), [0.0, 0.0])
    for var in (b, z):
        np.testing.assert_array_equal(velocity(opt, var), [0.0, 0.0])


def test_zero_weight_uses_trust_one():
    z = keras.Variable(np.zeros(2, "float32"), name="kernel")
    opt = LARS(0.5, momentum=0.9, weight_decay=0.1, eeta=0.001)
    opt.apply_gradients([(tf.constant([1.0, -2.0]), z)])
    # w = 0: trust = 1, plain momentum SGD: -lr * g.
    np.testing.assert_allclose(z.numpy(), [-0.5, 1.0], rtol=1e-6)


def test_exclude_from_layer_adaptation_takes_lr_times_g():
    values = {
        "kernel": np.array([3.0, 4.0]),
        "bias": np.array([1.0, 2.0]),
        "special_kernel": np.array([3.0, 4.0]),
    }
    variables = [keras.Variable(v.astype("float32"), name=k) for k, v in values.items()]
    opt = LARS(
        0.5,
        momentum=0.9,
        weight_decay=0.01,
        eeta=0.02,
        exclude_from_layer_adaptation=["bias", "special"],
    )
    g = tf.constant([0.6, 0.8])
    opt.apply_gradients([(g, v) for v in variables])
    assert opt._adapts == [True, False, False]
    assert opt._decays == [True, False, True]
    # Adapted as in test_golden_values_one_step.
    np.testing.assert_allclose(variables[0].numpy(), [2.97, 3.96], rtol=1e-6)
    # Excluded, not decayed: w - lr * g = [1 - 0.3, 2 - 0.4].
    np.testing.assert_allclose(variables[1].numpy(), [0.7, 1.6], rtol=1e-6)
    # Excluded, decayed: w - lr * (g + wd * w) = w - 0.5 * [0.63, 0.84].
    np.testing.assert_allclose(variables[2].numpy(), [2.685, 3.58], rtol=1e-6)


def test_explicit_exclusions():
    values = {
        "kernel": np.array([3.0, 4.0]),
        "bias": np.array([1.0, 2.0]),
        "special_kernel": np.array([2.0, 0.0]),
    }
    g = np.array([0.6, 0.8])
    variables = [keras.Variable(v.astype("float32"), name=k) for k, v in values.items()]
    # "bias" is no longer excluded; "special" is excluded from weight decay
    # only; "^kernel$" is excluded from adaptation only.
    opt = LARS(
        0.5,
        momentum=0.9,
        weight_decay=0.1,
        eeta=0.02,
        exclude_from_weight_decay=["special"],
        exclude_from_layer_adaptation=["^kernel$"],
    )
    opt.apply_gradients([(tf.constant(g, tf.float32), v) for v in variables])
    assert opt._decays == [True, True, False]
    assert opt._adapts == [False, True, True]
    settings = {
        "kernel": (0.1, False),
        "bias": (0.1, True),
        "special_kernel": (0.0, True),
    }
    for var, (name, w0) in zip(variables, values.items()):
        wd, adapt = settings[name]
        expected, _ = reference_step(
            w0, g, 0 * w0, 0.5, 0.9, wd, 0.02, 0.0, False, adapt
        )
        np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)


def test_weight_decay_excludes_do_not_exclude_from_adaptation():
    w = keras.Variable(np.array([3.0, 4.0], "float32"), name="frozen_scale")
    opt = LARS(0.5, weight_decay=0.1, eeta=0.02, exclude_from_weight_decay=["frozen"])
    opt.apply_gradients([(tf.constant([0.6, 0.8]), w)])
    # wd = 0, trust = 0.02 * 5 / 1 = 0.1: w - 0.05 * g.
    np.testing.assert_allclose(w.numpy(), [2.97, 3.96], rtol=1e-6)


def test_inherited_exclude_from_weight_decay_method():
    w = keras.Variable(np.array([3.0, 4.0], "float32"), name="kernel")
    opt = LARS(0.5, weight_decay=0.1, eeta=0.02)
    opt.exclude_from_weight_decay(var_list=[w])
    opt.apply_gradients([(tf.constant([0.6, 0.8]), w)])
    expected, _ = reference_step(
        [3, 4], [0.6, 0.8], [0, 0], 0.5, 0.9, 0.0, 0.02, 0, False, True
    )
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)


def test_default_exclusions_on_a_real_model():
    keras.backend.clear_session()  # layer names below assume fresh name counters
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(),
            keras.layers.LayerNormalization(),
            keras.layers.RMSNormalization(),
            keras.layers.Dense(2, use_bias=False),
        ]
    )
    opt = LARS(0.1)
    opt.build(model.trainable_variables)
    decays = {v.path: d for v, d in zip(model.trainable_variables, opt._decays)}
    adapts = {v.path: a for v, a in zip(model.trainable_variables, opt._adapts)}
    assert all(adapts.values())  # Algorithm 1 adapts every layer.
    assert decays == {
        "sequential/dense/kernel": True,
        "sequential/dense/bias": False,
        "sequential/batch_normalization/gamma": False,
        "sequential/batch_normalization/beta": False,
        "sequential/layer_normalization/gamma": False,
        "sequential/layer_normalization/beta": False,
        "sequential/rms_normalization/scale": False,
        "sequential/dense_1/kernel": True,
    }


def test_get_config_round_trip():
    lr = schedules.WarmUp(
        keras.optimizers.schedules.PolynomialDecay(2.0, 100, power=2.0), 10
    )
    opt = LARS(
        lr,
        momentum=0.8,
        weight_decay=5e-4,
        eeta=0.002,
        epsilon=1e-9,
        nesterov=True,
        exclude_from_weight_decay=["bias", "bn"],
        exclude_from_layer_adaptation=["bn"],
        clipnorm=1.0,
    )
    config = opt.get_config()
    restored = LARS.from_config(copy.deepcopy(config))  # from_config mutates
    assert restored.get_config() == config
    assert config["exclude_from_weight_decay"] == ["bias", "bn"]
    assert config["exclude_from_layer_adaptation"] == ["bn"]
    assert (config["momentum"], config["eeta"], config["nesterov"]) == (
        0.8,
        0.002,
        True,
    )
    assert isinstance(restored._learning_rate, schedules.WarmUp)
    for step in (0, 5, 10, 60):
        assert float(restored._learning_rate(step)) == pytest.approx(float(lr(step)))
    generic = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(generic, LARS) and generic.get_config() == config


def test_default_config_round_trip_adapts_everything():
    config = LARS(0.1).get_config()
    assert config["exclude_from_weight_decay"] is None
    assert config["exclude_from_layer_adaptation"] is None
    restored = LARS.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    variables = [
        keras.Variable(np.ones(2, "float32"), name=n) for n in ("kernel", "bias")
    ]
    restored.build(variables)
    assert restored._adapts == [True, True]
    assert restored._decays == [True, False]


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"momentum": 1.5}, "momentum"),
        ({"momentum": -0.1}, "momentum"),
        ({"eeta": -1.0}, "eeta"),
        ({"epsilon": -1e-3}, "epsilon"),
        ({"weight_decay": -1e-4}, "weight_decay"),
        ({"exclude_from_weight_decay": "bias"}, "exclude_from_weight_decay"),
        (
            {"exclude_from_layer_adaptation": ["(unclosed"]},
            "exclude_from_layer_adaptation",
        ),
    ],
)
def test_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        LARS(0.1, **kwargs)


def _classification_data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).astype("int32")
    return x, y


def _small_model(seed=1, batch_norm=True):
    keras.utils.set_random_seed(seed)
    norm = [keras.layers.BatchNormalization()] if batch_norm else []
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu")]
        + norm
        + [keras.layers.Dense(2)]
    )


@pytest.mark.parametrize(
    "exclusions",
    [
        {},  # the defaults: every variable adapted
        {
            "exclude_from_weight_decay": ["bias", "gamma", "beta"],
            "exclude_from_layer_adaptation": ["gamma", "beta"],
        },
    ],
)
def test_save_and_load_keras_file(tmp_path, exclusions):
    x, y = _classification_data()
    model = _small_model()
    lr = schedules.PolynomialDecayWithWarmup(2.0, total_steps=40, warmup_steps=4)
    model.compile(
        optimizer=LARS(lr, nesterov=True, **exclusions),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)

    assert isinstance(loaded.optimizer, LARS)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    adapts = model.optimizer._adapts
    assert loaded.optimizer._adapts == adapts
    assert loaded.optimizer._decays == model.optimizer._decays
    assert adapts.count(False) == (2 if exclusions else 0)  # gamma and beta
    assert int(loaded.optimizer.iterations.numpy()) == 8
    saved_vars = [v.numpy() for v in model.optimizer.variables]
    loaded_vars = [v.numpy() for v in loaded.optimizer.variables]
    assert len(saved_vars) == len(loaded_vars) > 4
    assert any(np.abs(v).max() > 0 for v in saved_vars[2:])  # velocities moved
    for a, b in zip(saved_vars, loaded_vars):
        np.testing.assert_array_equal(a, b)
    # Training goes on identically from the loaded state.
    model.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0, shuffle=False)
    loaded.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


@pytest.fixture
def mixed_bfloat16():
    previous = keras.config.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_dtype_policy(previous)


def test_loss_scale_optimizer_and_mixed_bfloat16(mixed_bfloat16):
    x, y = _classification_data(512)
    # No BatchNormalization here: its moving statistics lag behind in 64
    # steps and would blur the inference-mode comparison below.
    model = _small_model(batch_norm=False)
    assert model.layers[0].compute_dtype == "bfloat16"
    inner = LARS(
        schedules.WarmUp(1.0, warmup_steps=5),
        momentum=0.9,
        weight_decay=1e-4,
        eeta=0.01,
    )
    opt = keras.optimizers.LossScaleOptimizer(inner)
    model.compile(
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    before = model.evaluate(x, y, verbose=0, return_dict=True)
    kernel_before = model.layers[0].kernel.numpy().copy()
    history = model.fit(x, y, batch_size=64, epochs=8, verbose=0)
    after = model.evaluate(x, y, verbose=0, return_dict=True)

    assert all(v.dtype == "float32" for v in model.trainable_variables)
    assert inner._velocities and all(v.dtype == "float32" for v in inner._velocities)
    assert int(inner.iterations.numpy()) == 64
    assert np.abs(velocity(inner, model.layers[0].kernel)).max() > 0
    assert np.all(np.isfinite(model.layers[0].kernel.numpy()))
    assert not np.allclose(model.layers[0].kernel.numpy(), kernel_before)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert after["loss"] < 0.5 * before["loss"]
    assert after["accuracy"] > 0.9
