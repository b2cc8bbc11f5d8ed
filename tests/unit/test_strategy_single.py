"""DDLStrategy in one process (a world of one) and its dataset splitting."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_ddl as ddl
from keras_ddl.keras import strategy as strategy_module
from keras_ddl.keras.strategy import _global_order, shard_global_batches


def small_model():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, activation="relu"),
                             keras.layers.Dense(3)])


def compile_model(model):
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def test_world_of_one_trains_bitwise_like_plain_keras():
    strategy = ddl.DDLStrategy()
    assert strategy.num_replicas_in_sync == 1 and (strategy.rank, strategy.size) == (0, 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 5)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with strategy.scope():
        model = compile_model(small_model())
    assert model.distribute_strategy is strategy
    plain = compile_model(small_model())
    plain.set_weights(model.get_weights())
    history = model.fit(ds, epochs=2, verbose=0).history
    expected = plain.fit(ds, epochs=2, verbose=0).history
    assert history == expected
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.predict(x, verbose=0), plain.predict(x, verbose=0))
    assert model.evaluate(ds, verbose=0) == plain.evaluate(ds, verbose=0)


def test_world_of_one_collectives_are_identities():
    strategy = ddl.DDLStrategy()
    value = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(strategy.reduce("SUM", value, axis=None), value)
    np.testing.assert_array_equal(strategy.reduce("MEAN", tf.ones([4, 2]), axis=0), [1.0, 1.0])
    np.testing.assert_array_equal(strategy.gather(value, axis=0), value)
    assert int(strategy.run(lambda: tf.distribute.get_replica_context()
                            .replica_id_in_sync_group)) == 0
    ds = tf.data.Dataset.range(6).batch(3)
    assert [b.numpy().tolist() for b in strategy.experimental_distribute_dataset(ds)] == \
        [[0, 1, 2], [3, 4, 5]]
    out = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(ddl.gather_predictions(out, batch_size=2), out)


def test_untested_versions_warn(monkeypatch):
    monkeypatch.setattr(strategy_module, "TESTED_TENSORFLOW", ("0.1",))
    monkeypatch.setattr(strategy_module, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"tested\s+with TensorFlow 0\.1\.x only"):
        ddl.DDLStrategy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddl.DDLStrategy()  # once per process


def test_gradient_layout_knobs():
    assert ddl.DDLStrategy().extended._overlap is True  # overlap by default
    assert ddl.DDLStrategy().extended._bucket_bytes is None
    assert ddl.DDLStrategy(bucket_mb=0.5).extended._bucket_bytes == 2**19
    assert ddl.DDLStrategy(overlap_gradients=False).extended._overlap is False
    with pytest.raises(ValueError, match=r"DDLStrategy\(bucket_mb=\.\.\.\) must be a positive"):
        ddl.DDLStrategy(bucket_mb=0)
    with pytest.raises(ValueError, match=r"DDLStrategy\(bucket_mb=2\) needs overlap_gradients"):
        ddl.DDLStrategy(overlap_gradients=False, bucket_mb=2)
    with pytest.raises(ValueError, match=r"overlap_gradients=\.\.\.\) must be True or False"):
        ddl.DDLStrategy(overlap_gradients=1)


def rows_of(ds):
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), b) for b in ds]


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_global_batches_split_into_contiguous_even_slices(count):
    n = 11
    x = np.arange(n)
    ds = tf.data.Dataset.from_tensor_slices((x, x * 10)).batch(5)  # batches of 5, 5, 1
    parts = [rows_of(shard_global_batches(ds, r, count)) for r in range(count)]
    assert all(len(p) == 3 for p in parts)  # every rank takes every step
    for step, rows in enumerate(([0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10])):
        got = []
        for r in range(count):
            a, b = parts[r][step]
            assert b == [v * 10 for v in a]
            base, extra = divmod(len(rows), count)
            assert len(a) == base + (r < extra)
            got += a
        assert got == rows


def test_split_keeps_structures_and_composite_tensors():
    ragged = tf.ragged.constant([[1], [2, 2], [3, 3, 3], [4]])
    sparse = tf.sparse.from_dense(tf.constant([[1, 0], [0, 2], [3, 0], [0, 4]]))
    ds = tf.data.Dataset.from_tensors(
        {"dense": tf.constant([[1.0], [2.0], [3.0], [4.0]]), "ragged": ragged, "sparse": sparse})
    first, second = [next(iter(shard_global_batches(ds, r, 2))) for r in range(2)]
    np.testing.assert_array_equal(second["dense"].numpy(), [[3.0], [4.0]])
    assert second["ragged"].to_list() == [[3, 3, 3], [4]]
    np.testing.assert_array_equal(tf.sparse.to_dense(first["sparse"]).numpy(), [[1, 0], [0, 2]])
    np.testing.assert_array_equal(tf.sparse.to_dense(second["sparse"]).numpy(), [[3, 0], [0, 4]])
    # a one-element tuple stays a tuple (Keras' predict inputs are (x,))
    single = tf.data.Dataset.from_tensors((tf.range(4),))
    (part,) = next(iter(shard_global_batches(single, 1, 2)))
    assert part.numpy().tolist() == [2, 3]


def test_unbatched_datasets_are_refused_with_advice():
    with pytest.raises(ValueError, match="auto_shard_policy"):
        shard_global_batches(tf.data.Dataset.range(4), 0, 2)


def test_global_order_undoes_the_split():
    total, batch, size = 10, 4, 3  # batches of 4, 4, 2 rows over 3 ranks
    per_rank = []
    for r in range(size):
        rows = []
        for start in range(0, total, batch):
            n = min(batch, total - start)
            base, extra = divmod(n, size)
            first = start + r * base + min(r, extra)
            rows += list(range(first, first + base + (r < extra)))
        per_rank.append(rows)
    assert [len(p) for p in per_rank] == [5, 3, 2]
    concatenated = sum(per_rank, [])  # what allgather returns: rank order
    order = _global_order([len(p) for p in per_rank], batch)
    assert [concatenated[i] for i in order] == list(range(total))
    with pytest.raises(ValueError, match="batch_size=None"):
        _global_order([4, 3, 3], batch)
