"""DistributedOptimizer, DistributedGradientTape and the callbacks in this
process, with no launcher: a world of size 1 (the collectives are
identities, so what is checked here is the wrapping, the state and the
learning-rate arithmetic; tests/mpi/test_keras_mpi.py checks the averaging)."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ddl as ddl
from keras_ddl.optimizers import LARS


def make_model(seed=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(2)])


def data(rows=16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, 3)).astype(np.float32),
            rng.normal(size=(rows, 2)).astype(np.float32))


def test_wrapper_delegates_to_the_wrapped_optimizer():
    inner = keras.optimizers.SGD(0.1, momentum=0.9)
    opt = ddl.DistributedOptimizer(inner)
    model = make_model()
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = data()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert model.optimizer is opt and opt.inner_optimizer is inner
    assert int(opt.iterations) == int(inner.iterations) == 4
    assert [id(v) for v in opt.variables] == [id(v) for v in inner.variables]
    opt.learning_rate = 0.25
    assert float(inner.learning_rate.numpy()) == 0.25
    assert opt.learning_rate is inner.learning_rate


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.Adam(0.01),
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    lambda: keras.optimizers.Lamb(0.01),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=256.0),
], ids=["adam", "adamw", "lamb", "loss_scale_sgd"])
def test_same_updates_as_the_wrapped_optimizer_alone(make):
    x, y = data()
    weights = []
    for wrap in (False, True):
        model = make_model()
        opt = make()
        model.compile(optimizer=ddl.DistributedOptimizer(opt) if wrap else opt, loss="mse",
                      jit_compile=False)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def test_config_round_trip_keeps_the_wrapped_config():
    inner = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.AdamW(0.003, weight_decay=0.02, clipnorm=1.5), initial_scale=64.0)
    opt = ddl.DistributedOptimizer(inner, op=ddl.Sum, compression=ddl.Compression.fp16,
                                   gradient_accumulation_steps=3, name="dist", bucket_mb=2.5)
    config = keras.optimizers.serialize(opt)
    assert config["registered_name"] == "keras_ddl>DistributedOptimizer"
    back = keras.optimizers.deserialize(config)
    assert isinstance(back, ddl.DistributedOptimizer)
    assert back.get_config() == opt.get_config()
    assert back.op == ddl.Sum and back.compression is ddl.Compression.fp16
    assert back.accumulation_steps == 3 and back.name == "dist"
    assert back.overlap_gradients is True and back.bucket_mb == 2.5
    off = keras.optimizers.deserialize(keras.optimizers.serialize(
        ddl.DistributedOptimizer(keras.optimizers.SGD(), overlap_gradients=False)))
    assert off.overlap_gradients is False and off.bucket_mb is None
    assert isinstance(back.inner_optimizer, keras.optimizers.LossScaleOptimizer)
    inner_back = back.inner_optimizer.inner_optimizer
    assert isinstance(inner_back, keras.optimizers.AdamW)
    assert inner_back.get_config() == inner.inner_optimizer.get_config()


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: LARS(0.5, momentum=0.9, eeta=0.01),
], ids=["sgd", "lars"])
def test_keras_file_round_trip_restores_the_state(tmp_path, make):
    x, y = data()
    model = make_model()
    model.compile(optimizer=ddl.DistributedOptimizer(make()), loss="mse", jit_compile=False)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.optimizer.inner_optimizer) is type(model.optimizer.inner_optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for m in (model, loaded):
        m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_public_module_paths_are_modules_and_saved_models_load_in_a_new_process(tmp_path):
    """keras_ddl.callbacks, .data, .schedules, .optimizers(.lars) and .ops are
    modules of their own (no sys.modules aliases) holding their layer's
    objects; a model saved with DistributedOptimizer(LARS) and a WarmUp
    schedule loads in a new process that only imports keras_ddl, and so does
    a LARS config naming the flat layout's module keras_ddl.optimizers.lars."""
    import importlib
    import json
    import subprocess
    import sys
    layer_of = {"callbacks": "keras.callbacks", "data": "keras.data",
                "schedules": "keras.schedules", "optimizers": "keras.optimizers",
                "optimizers.lars": "keras.optimizers.lars", "ops": "tensorflow"}
    package = os.path.dirname(ddl.__file__)
    for public, layer in layer_of.items():
        module = importlib.import_module(f"keras_ddl.{public}")
        inner = importlib.import_module(f"keras_ddl.{layer}")
        assert module.__name__ == f"keras_ddl.{public}" and module is not inner
        assert os.path.dirname(module.__file__).startswith(package), module.__file__
        # Every name, private ones too (the path was the layer module itself),
        # but the submodule keras_ddl.optimizers.lars of its own.
        names = [n for n in vars(inner) if not n.startswith("__")
                 and (public, n) != ("optimizers", "lars")]
        assert names and all(getattr(module, n) is getattr(inner, n) for n in names), public
        assert module.__doc__ and getattr(module, "__all__", None) == getattr(inner, "__all__", None)
    assert ddl.optimizers.lars.LARS is LARS and ddl.ops.allreduce is ddl.allreduce

    x, y = data()
    model = make_model()
    schedule = ddl.schedules.WarmUp(0.5, warmup_steps=3, initial_learning_rate=0.1)
    model.compile(optimizer=ddl.DistributedOptimizer(LARS(schedule, momentum=0.9)), loss="mse",
                  jit_compile=False)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    flat = keras.saving.serialize_keras_object(LARS(0.25, momentum=0.5))
    flat["module"] = "keras_ddl.optimizers.lars"
    script = ("import json, sys, keras, keras_ddl\n"
              "m = keras.saving.load_model(sys.argv[1])\n"
              "o = keras.saving.deserialize_keras_object(json.loads(sys.argv[2]))\n"
              "print('LOADED', type(m.optimizer).__name__, type(m.optimizer.inner_optimizer)"
              ".__name__, type(m.optimizer.inner_optimizer._learning_rate).__name__,"
              " type(o).__name__, float(o.learning_rate), [w.tolist() for w in m.get_weights()])\n")
    proc = subprocess.run([sys.executable, "-c", script, path, json.dumps(flat)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = proc.stdout.split("LOADED ", 1)[1]
    assert loaded.startswith("DistributedOptimizer LARS WarmUp LARS 0.25 "), loaded[:200]
    assert loaded.split(" ", 5)[5].strip() == str([w.tolist() for w in model.get_weights()])


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_gradient_accumulation_is_one_update_on_the_mean(run_eagerly):
    x, y = data()
    model = make_model()
    opt = ddl.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5),
                                   gradient_accumulation_steps=2)
    model.compile(optimizer=opt, loss="mse", jit_compile=False, run_eagerly=run_eagerly)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    reference = make_model()
    reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss="mse")
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(opt.iterations) == 2
    # The rank-local partial sums are not optimizer state.
    assert len(opt.variables) == len(opt.inner_optimizer.variables)


def test_none_gradients_stay_none_and_indexed_slices_are_applied():
    a = keras.Variable(np.ones([3, 2], np.float32), name="a")
    b = keras.Variable(np.ones([2], np.float32), name="b")
    opt = ddl.DistributedOptimizer(keras.optimizers.SGD(1.0))
    sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([1]), tf.constant([3, 2]))
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        opt.apply_gradients([(sparse, a), (None, b)])
    np.testing.assert_array_equal(a.numpy(), [[1, 1], [0, -1], [1, 1]])
    np.testing.assert_array_equal(b.numpy(), [1, 1])


def test_invalid_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        ddl.DistributedOptimizer("sgd")
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        ddl.DistributedOptimizer(ddl.DistributedOptimizer(keras.optimizers.SGD()))
    with pytest.raises(ValueError, match="Average or ddl.Sum"):
        ddl.DistributedOptimizer(keras.optimizers.SGD(), op=ddl.Max)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        ddl.DistributedOptimizer(keras.optimizers.SGD(), gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="compression"):
        ddl.DistributedOptimizer(keras.optimizers.SGD(), compression="zip")
    with pytest.raises(ValueError, match=r"overlap_gradients=\.\.\.\) must be True or False"):
        ddl.DistributedOptimizer(keras.optimizers.SGD(), overlap_gradients="yes")
    for bad in (0, -1.0, True, "4"):
        with pytest.raises(ValueError, match=r"bucket_mb=\.\.\.\) must be a positive number"):
            ddl.DistributedOptimizer(keras.optimizers.SGD(), bucket_mb=bad)
    with pytest.raises(ValueError, match="bucket_mb=4.*needs overlap_gradients=True"):
        ddl.DistributedOptimizer(keras.optimizers.SGD(), overlap_gradients=False, bucket_mb=4)
    with pytest.raises(ValueError, match=r"DistributedGradientTape\(bucket_mb"):
        ddl.DistributedGradientTape(tf.GradientTape(), bucket_mb=0)


def test_buckets_fill_from_the_last_gradient_to_the_first():
    from keras_ddl.keras.gradient_overlap import plan_buckets
    sizes = [60, 20, 40, 8, 200, 4]  # bytes of float32 tensors
    tensors = [tf.zeros([n // 4]) for n in sizes]
    assert plan_buckets(tensors, 50) == [[5], [4], [3, 2], [1], [0]]
    assert plan_buckets(tensors, 80) == [[5], [4], [3, 2, 1], [0]]
    assert plan_buckets(tensors, 10**6) == [[5, 4, 3, 2, 1, 0]]
    unknown = tf.TensorSpec([None, 3])  # unknown size: a bucket of its own
    assert plan_buckets([tensors[3], unknown, tensors[3]], 10**6) == [[2], [1], [0]]


def test_distributed_optimizer_under_ddl_strategy_is_a_clear_error():
    strategy = ddl.DDLStrategy()
    with strategy.scope():
        with pytest.raises(ValueError, match=r"DistributedOptimizer cannot be used under "
                                             r"DDLStrategy\.scope\(\).*reduced twice.*plain"):
            ddl.DistributedOptimizer(keras.optimizers.SGD(0.1))
    opt = ddl.DistributedOptimizer(keras.optimizers.SGD(0.1))  # made outside, compiled inside
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = data(8)
    with pytest.raises(ValueError, match="DistributedOptimizer cannot be used under DDLStrategy"):
        model.fit(x, y, batch_size=4, verbose=0)

    v = tf.Variable(2.0)

    def replica_step():
        with tf.GradientTape() as tape:
            loss = v * v
        return ddl.DistributedGradientTape(tape).gradient(loss, [v])

    with pytest.raises(ValueError, match="DistributedGradientTape cannot be used under "
                                         "DDLStrategy"):
        strategy.run(replica_step)
    # outside the strategy both work as before
    assert float(replica_step()[0]) == 4.0
    plain = make_model()
    plain.compile(optimizer=ddl.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  jit_compile=False)
    plain.fit(x, y, batch_size=4, verbose=0)


def test_mixed_float16_auto_loss_scaling_is_plain_keras_in_a_world_of_one():
    # compile() wraps the DistributedOptimizer in a LossScaleOptimizer; with
    # one process the loss-scale hook changes nothing, overflowing step included.
    x, y = data()
    x[5, 1] = 1e5  # overflows float16 in the second batch
    weights, scales = [], []
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        for wrap in (False, True):
            model = make_model()
            opt = keras.optimizers.SGD(0.1)
            model.compile(optimizer=ddl.DistributedOptimizer(opt) if wrap else opt, loss="mse",
                          jit_compile=False)
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
            weights.append(model.get_weights())
            scales.append(float(model.optimizer.dynamic_scale.numpy()))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert scales[0] == scales[1] == 2.0**14
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def test_jit_compile_is_refused_with_a_clear_error():
    model = make_model()
    model.compile(optimizer=ddl.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  jit_compile=True)
    x, y = data(8)
    with pytest.raises(ValueError, match="jit_compile=False"):
        model.fit(x, y, batch_size=4, verbose=0)


def test_gradient_tape_keeps_structure_and_nones():
    v = tf.Variable([1.0, 2.0])
    w = tf.Variable(3.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v)
    grads = ddl.DistributedGradientTape(tape).gradient(loss, {"v": v, "w": w})
    assert set(grads) == {"v", "w"} and grads["w"] is None
    np.testing.assert_array_equal(grads["v"].numpy(), [2.0, 4.0])
    with ddl.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        loss = w * w
    assert float(tape.gradient(loss, w)) == 6.0
    assert float(tape.gradient(loss, [w])[0]) == 6.0  # persistent: delegated attribute
    with pytest.raises(TypeError, match="tf.GradientTape"):
        ddl.DistributedGradientTape(object())


class LrRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))


def fit_with(callbacks, epochs, lr=0.05, batches=4, make_opt=None):
    model = make_model()
    opt = make_opt() if make_opt else keras.optimizers.SGD(lr, momentum=0.9)
    model.compile(optimizer=ddl.DistributedOptimizer(opt), loss="mse", jit_compile=False)
    x, y = data(4 * batches)
    model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model


def test_schedule_per_batch_and_constant():
    recorder = LrRecorder()
    fit_with([ddl.callbacks.LearningRateScheduleCallback(
        0.1, lambda e: 1.0 / (1.0 + e), staircase=False), recorder], epochs=2)
    want = [0.1 / (1.0 + e + b / 4) for e in range(2) for b in range(4)]
    np.testing.assert_allclose(recorder.lrs, want, rtol=1e-6)

    recorder = LrRecorder()
    fit_with([ddl.callbacks.LearningRateScheduleCallback(0.1, 0.5, start_epoch=1, end_epoch=2),
              recorder], epochs=3, lr=0.01)
    np.testing.assert_allclose(recorder.lrs, [0.01] * 4 + [0.05] * 8, rtol=1e-7)


def test_warmup_at_size_one_is_the_initial_rate():
    recorder = LrRecorder()
    fit_with([ddl.callbacks.LearningRateWarmupCallback(0.2, warmup_epochs=1), recorder],
             epochs=2)
    np.testing.assert_allclose(recorder.lrs, [0.2] * 8, rtol=1e-7)


def test_momentum_correction_rescales_sgd_velocity():
    model = fit_with([], epochs=1)
    inner = model.optimizer.inner_optimizer
    before = [m.numpy() for m in inner.momentums]
    ddl.callbacks.set_learning_rate(model, 0.025, momentum_correction=True)
    for m, b in zip(inner.momentums, before):
        np.testing.assert_allclose(m.numpy(), b * 0.5, rtol=1e-6)
    ddl.callbacks.set_learning_rate(model, 0.05, momentum_correction=False)
    for m, b in zip(inner.momentums, before):
        np.testing.assert_allclose(m.numpy(), b * 0.5, rtol=1e-6)


def test_learning_rate_schedule_optimizer_is_a_clear_error():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    with pytest.raises(ValueError, match="LearningRateSchedule"):
        fit_with([ddl.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1)], epochs=1,
                 make_opt=lambda: keras.optimizers.SGD(schedule))


def test_warmup_needs_steps_when_fit_does_not_know_them():
    dataset = tf.data.Dataset.from_tensor_slices(data(8)).batch(4).filter(lambda x, y: True)
    model = make_model()
    model.compile(optimizer=ddl.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  jit_compile=False)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        model.fit(dataset, epochs=1, verbose=0,
                  callbacks=[ddl.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1)])


def test_on_rank_forwards_on_its_rank_and_checks_the_rank():
    class Counter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = 0

        def on_epoch_end(self, epoch, logs=None):
            self.epochs += 1

    counter = Counter()
    wrapped = ddl.callbacks.on_rank(0, counter)
    model = fit_with([wrapped], epochs=2)
    assert counter.epochs == 2 and counter.model is model
    with pytest.raises(ValueError, match="rank"):
        ddl.callbacks.on_rank(1, Counter())
    with pytest.raises(TypeError):
        ddl.callbacks.on_rank(0, object())


def test_metric_average_and_broadcast_at_size_one_change_nothing():
    class Logs(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.logs = dict(logs)

    before, after = Logs(), Logs()
    fit_with([ddl.callbacks.BroadcastGlobalVariablesCallback(0), before,
              ddl.callbacks.MetricAverageCallback(), after], epochs=1)
    assert before.logs == after.logs and "loss" in after.logs
