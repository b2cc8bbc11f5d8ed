"""The Horovod front door and the Horovod-parity pieces in this process, with
no launcher (a world of size 1): build flags, signatures, argument mapping,
config round trips. tests/mpi/test_horovod_mpi.py checks the multi-process
behaviour."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ddl as ddl
import keras_ddl.horovod.keras as hvd_keras_alias
import keras_ddl.horovod.tensorflow as hvd_tf
import keras_ddl.horovod.tensorflow.keras as hvd


def test_build_flags_answer_truthfully():
    assert hvd.mpi_built() is True and hvd.mpi_enabled() is True
    assert hvd.gloo_built() is False and hvd.gloo_enabled() is False
    assert hvd.nccl_built() == 0 and not hvd.nccl_built()
    for flag in (hvd.ddl_built, hvd.ccl_built, hvd.cuda_built, hvd.rocm_built):
        assert flag() is False, flag.__name__
    hvd.init()
    assert hvd.is_initialized() and hvd.size() == 1 and hvd.rank() == 0
    assert hvd.mpi_threads_supported() is True


def parameters(function):
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


EMPTY = inspect.Parameter.empty


def test_signatures_are_horovods():
    g = hvd.global_process_set
    assert parameters(hvd_tf.allreduce) == [
        ("tensor", EMPTY), ("average", None), ("device_dense", ""), ("device_sparse", ""),
        ("compression", hvd.Compression.none), ("op", None), ("prescale_factor", 1.0),
        ("postscale_factor", 1.0), ("name", None), ("process_set", g),
        ("ignore_name_scope", False)]
    assert parameters(hvd.DistributedOptimizer) == [
        ("optimizer", EMPTY), ("name", None), ("device_dense", ""), ("device_sparse", ""),
        ("compression", hvd.Compression.none), ("sparse_as_dense", False),
        ("gradient_predivide_factor", 1.0), ("op", hvd.Average),
        ("backward_passes_per_step", 1), ("average_aggregated_gradients", False),
        ("num_groups", 0), ("groups", None), ("process_set", g),
        ("scale_local_gradients", True)]
    assert [n for n, _ in parameters(hvd_tf.DistributedOptimizer)][:12] == [
        "optimizer", "name", "use_locking", "device_dense", "device_sparse", "compression",
        "sparse_as_dense", "backward_passes_per_step", "op", "gradient_predivide_factor",
        "average_aggregated_gradients", "num_groups"]
    assert parameters(hvd_tf.reducescatter)[3] == ("op", hvd.Average)
    assert parameters(hvd.init) == [("comm", None), ("process_sets", None)]
    assert parameters(hvd.callbacks.BroadcastGlobalVariablesCallback) == [
        ("root_rank", EMPTY), ("device", ""), ("local_variables", None)]
    assert [n for n, _ in parameters(hvd.callbacks.LearningRateWarmupCallback)] == [
        "initial_lr", "warmup_epochs", "momentum_correction", "steps_per_epoch", "verbose"]


def test_keras_alias_and_callbacks_module():
    import keras_ddl.horovod.keras.callbacks as alias_callbacks
    assert hvd_keras_alias.DistributedOptimizer is hvd.DistributedOptimizer
    assert alias_callbacks is hvd_keras_alias.callbacks
    # Every public name of hvd.callbacks, and the same object under both paths.
    public = {n for n in vars(hvd.callbacks) if not n.startswith("_")}
    assert public == {n for n in vars(alias_callbacks) if not n.startswith("_")}
    assert public and all(getattr(alias_callbacks, n) is getattr(hvd.callbacks, n)
                          for n in public)


def test_warmup_callback_takes_horovods_positional_order():
    callback = hvd.callbacks.LearningRateWarmupCallback(0.4, 3, False, 10, 1)
    assert (callback.initial_lr, callback.warmup_epochs, callback.momentum_correction,
            callback.steps_per_epoch, callback.verbose) == (0.4, 3, False, 10, 1)
    assert isinstance(callback, ddl.callbacks.LearningRateWarmupCallback)


def test_refused_arguments_name_themselves():
    with pytest.raises(NotImplementedError, match="session"):
        hvd_tf.broadcast_object(1, session=object())
    with pytest.raises(NotImplementedError, match="elastic"):
        hvd.elastic  # noqa: B018
    with pytest.raises(AttributeError):
        hvd_tf.no_such_name  # noqa: B018
    with pytest.raises(NotImplementedError, match="DDL_TIMELINE"):
        hvd.stop_timeline()
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(NotImplementedError, match="compression"):
        hvd.allreduce(1.0, compression=object())
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(1.0, average=True, op=hvd.Sum)
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        ddl.broadcast_global_variables(0)


def test_process_set_arguments_of_one_process():
    hvd.init(process_sets="dynamic")  # accepted: sets can always be added later
    with pytest.raises(ValueError, match="process_sets='static'"):
        hvd.init(process_sets="static")
    with pytest.raises(ValueError, match="item 0 is \\[0\\], not a ProcessSet"):
        hvd.init(process_sets=[[0]])
    unregistered = hvd.ProcessSet([0])
    assert (unregistered.size(), unregistered.rank(), unregistered.included()) == (None, None, True)
    assert hvd.remove_process_set(unregistered) is False
    with pytest.raises(ValueError, match=r"allgather\(process_set=.*not registered.*rank 0"):
        hvd_tf.allgather(tf.ones([1]), process_set=unregistered)
    with pytest.raises(ValueError, match=r"size_op\(process_set_id=99\)"):
        hvd_tf.size_op(process_set_id=99)
    alone = hvd.add_process_set([0])
    assert alone.process_set_id > 0 and int(hvd_tf.size_op(alone.process_set_id)) == 1
    assert hvd.remove_process_set(alone) is True and alone.process_set_id is None


def test_sync_batch_norm_config_round_trip_and_saved_model(tmp_path):
    layer = ddl.SyncBatchNormalization(axis=1, momentum=0.7, epsilon=1e-2, center=False,
                                       gamma_initializer="ones", name="sbn")
    config = layer.get_config()
    assert "synchronized" not in config and config["momentum"] == 0.7 and config["axis"] == 1
    copy = ddl.SyncBatchNormalization.from_config(config)
    assert copy.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is ddl.SyncBatchNormalization and restored.get_config() == config
    assert hvd.SyncBatchNormalization is ddl.SyncBatchNormalization

    model = keras.Sequential([keras.Input((4,)), ddl.SyncBatchNormalization()])
    x = np.random.default_rng(0).normal(size=[8, 4]).astype(np.float32)
    model(x, training=True)  # moves the moving statistics
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.layers[0]) is ddl.SyncBatchNormalization
    np.testing.assert_array_equal(loaded(x, training=False), model(x, training=False))


def test_sync_batch_norm_is_batch_norm_on_one_process():
    x = np.random.default_rng(1).normal(2.0, 3.0, size=[6, 5]).astype(np.float32)
    sync, plain = ddl.SyncBatchNormalization(), keras.layers.BatchNormalization()
    np.testing.assert_allclose(sync(x, training=True), plain(x, training=True), rtol=1e-6)
    with pytest.raises(ValueError, match="synchronized"):
        ddl.SyncBatchNormalization(synchronized=True)


def test_optimizer_config_round_trip_with_the_new_options():
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=3,
                                   scale_local_gradients=False)
    config = opt.get_config()
    assert config["gradient_accumulation_steps"] == 3
    assert config["average_accumulated_gradients"] is False
    assert config["scale_local_gradients"] is False
    assert ddl.DistributedOptimizer.from_config(config).get_config() == config
    old = {k: v for k, v in config.items()
           if k not in ("average_accumulated_gradients", "scale_local_gradients")}
    assert ddl.DistributedOptimizer.from_config(old).average_accumulated_gradients is True


def test_partial_optimizer_needs_built_layers():
    with pytest.raises(ValueError, match="'head'.*no trainable weights"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                        local_layers=[keras.layers.Dense(2, name="head")])
    with pytest.raises(TypeError, match="item 0"):
        ddl.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=["head"])


def test_load_model_wraps_a_plain_optimizer(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.save(tmp_path / "plain.keras")
    loaded = hvd.load_model(str(tmp_path / "plain.keras"), compression=hvd.Compression.fp16)
    assert isinstance(loaded.optimizer, ddl.DistributedOptimizer)
    # Horovod's FP16Compressor runs as keras_ddl's fp16 wire compression.
    assert loaded.optimizer.compression is ddl.Compression.fp16
    x = np.ones([4, 3], np.float32)
    loaded.fit(x, np.zeros([4, 2], np.float32), verbose=0)  # it trains


def test_object_collectives_and_ops_on_one_process():
    value = {"a": np.arange(3), "b": "text", "c": None}
    got = ddl.broadcast_object(value)
    assert got is value
    gathered = ddl.allgather_object(value)
    assert len(gathered) == 1 and gathered[0]["b"] == "text"
    assert np.array_equal(gathered[0]["a"], np.arange(3))
    assert int(ddl.size_op()) == 1 and ddl.rank_op().dtype == tf.int32
    # Inside a tf.function the object is exchanged while tracing, and the
    # traced function returns it as a constant.
    assert int(tf.function(lambda: ddl.broadcast_object(7) + tf.constant(1))()) == 8
    with pytest.raises(TypeError, match="prescale_factor"):
        ddl.allreduce(tf.ones([2]), prescale_factor="2")


def test_join_alone_returns_this_rank():
    """One process is every rank: its join is the last, and returns at once."""
    assert hvd.join() == 0
    assert hvd_tf.join(device="/cpu:0") == 0
