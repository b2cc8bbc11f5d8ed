"""ddl.callbacks.BackupAndRestore in one process: arguments, the backup
files (pruning, falling back past a damaged backup, a full disk), and
resuming mid-epoch bitwise by kind of input. (Kill and resume across ranks,
and at another world size: tests/mpi/test_resume_mpi.py.)"""

import hashlib
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ddl as ddl
from keras_ddl.keras import backup_store

SAMPLES, FEATURES, BATCH = 40, 5, 8   # 5 batches an epoch


def make_model():
    """Dropout (a seed generator), BatchNorm (non-trainable state), momentum
    (optimizer slots) and a metric: all of it must come back."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8),
                              keras.layers.BatchNormalization(), keras.layers.Dropout(0.3),
                              keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse", metrics=["mae"])
    return model


def data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32),
            rng.normal(size=(SAMPLES, 3)).astype(np.float32))


def digest(model):
    state = model.variables + model.optimizer.variables
    return hashlib.sha256(b"".join(np.asarray(v.numpy()).tobytes() for v in state)).hexdigest()


class Interrupt(Exception):
    pass


class InterruptAt(keras.callbacks.Callback):
    """Stops fit (as a crash would) when batch `count` (counted over the
    whole fit) is about to start."""

    def __init__(self, count):
        super().__init__()
        self.count, self.seen = count, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.seen == self.count:
            raise Interrupt()
        self.seen += 1


@pytest.mark.parametrize("kwargs, named", [
    ({"backup_dir": ""}, "backup_dir"),
    ({"backup_dir": "b", "keep": 0}, "keep"),
    ({"backup_dir": "b", "keep": True}, "keep"),
    ({"backup_dir": "b", "root_rank": 1}, "root_rank"),
    ({"backup_dir": "b", "save_freq": 0}, "save_freq"),
    ({"backup_dir": "b", "save_freq": "batch"}, "save_freq"),
    ({"backup_dir": "b", "save_freq": True}, "save_freq"),
    ({"backup_dir": "b", "global_batch_size": 0}, "global_batch_size"),
])
def test_bad_arguments_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        ddl.callbacks.BackupAndRestore(**kwargs)


def test_keeps_the_newest_and_falls_back_past_a_damaged_one(tmp_path, capfd):
    x, y = data()
    backup = ddl.callbacks.BackupAndRestore(tmp_path / "b", keep=2)
    model = make_model()
    model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, shuffle=False, callbacks=[backup])
    assert [key for key, _ in backup.backups()] == [(2, 0), (3, 0)]
    assert sorted(os.listdir(tmp_path / "b")) == ["epoch-000002", "epoch-000003"]
    assert sorted(os.listdir(tmp_path / "b" / "epoch-000003")) == [
        "meta.json", "rank-00000.npz", "variables.bin"]

    # Damage the newest backup's variables: its checksum no longer matches.
    variables = tmp_path / "b" / "epoch-000003" / "variables.bin"
    raw = bytearray(variables.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    variables.write_bytes(bytes(raw))

    resumed = make_model()
    again = ddl.callbacks.BackupAndRestore(tmp_path / "b", keep=2)
    history = resumed.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, shuffle=False,
                          callbacks=[again])
    assert again.restored_epoch == 2
    assert len(history.history["loss"]) == 1  # only epoch 3 was trained again
    assert "does not match the checksum" in capfd.readouterr().err
    # Epoch 3 redone from epoch 2's state gives epoch 3's state bitwise.
    assert digest(resumed) == digest(model)
    # A later fit on the model starts where its own arguments say (the
    # restore does not stick), and the rewritten epoch 3 verifies again.
    assert resumed._initial_epoch is None
    assert [key for key, _ in again.backups()] == [(2, 0), (3, 0)]


def test_every_backup_damaged_is_an_error(tmp_path):
    x, y = data()
    make_model().fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                     callbacks=[ddl.callbacks.BackupAndRestore(tmp_path / "b")])
    (tmp_path / "b" / "epoch-000001" / "variables.bin").write_bytes(b"damaged")
    with pytest.raises(RuntimeError, match="none loads"):
        make_model().fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                         callbacks=[ddl.callbacks.BackupAndRestore(tmp_path / "b")])


def test_a_backup_of_another_model_is_an_error_naming_the_variable(tmp_path):
    x, y = data()
    make_model().fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                     callbacks=[ddl.callbacks.BackupAndRestore(tmp_path / "b")])
    other = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4),
                              keras.layers.Dense(3)])
    other.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    with pytest.raises(RuntimeError, match=r"could not load the backup .*epoch-000001: "
                                           r"ValueError: the backup holds \d+ variables"):
        other.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                  callbacks=[ddl.callbacks.BackupAndRestore(tmp_path / "b")])


@pytest.mark.parametrize("background", [False, True])
def test_a_full_disk_is_a_clear_error_and_the_previous_backup_stays(tmp_path, monkeypatch,
                                                                     background):
    # From epoch 2 on the disk has 10 KB free; written in the background,
    # the error comes at the next save or at the end of fit.
    x, y = data()
    backup = ddl.callbacks.BackupAndRestore(tmp_path / "b", background=background)

    class DiskFills(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                backup._writer.wait()  # the disk fills once epoch 1's backup is on it
                monkeypatch.setattr(backup_store, "free_bytes", lambda directory: 10000)

    with pytest.raises(OSError, match=r"keras_ddl: BackupAndRestore could not write the "
                                      r"backup of epoch 2 in .*b on rank 0: No space left on "
                                      r"device: the backup needs about \d+ bytes, 10000 are "
                                      r"free; the previous backup .*epoch-000001 is intact"):
        make_model().fit(x, y, batch_size=BATCH, epochs=3, verbose=0, shuffle=False,
                         callbacks=[backup, DiskFills()])
    assert os.listdir(tmp_path / "b") == ["epoch-000001"]  # nothing half-written is left
    monkeypatch.undo()
    again = ddl.callbacks.BackupAndRestore(tmp_path / "b")
    make_model().fit(x, y, batch_size=BATCH, epochs=3, verbose=0, shuffle=False,
                     callbacks=[again])
    assert again.restored_epoch == 1 and [k for k, _ in again.backups()] == [(2, 0), (3, 0)]


def fit_interrupted_then_resumed(tmp_path, make_input, stop_at, save_freq=3, epochs=3,
                                 straight=True):
    """(straight run, resumed run, the resuming callback): a run stopped at
    batch `stop_at` (over the whole fit), then resumed by a fresh model and
    a fresh input; the straight run (uninterrupted) only if `straight`."""
    straight_model, straight_history = None, None
    if straight:
        straight_model = make_model()
        straight_history = straight_model.fit(
            **make_input(), epochs=epochs, verbose=0,
            callbacks=[ddl.callbacks.BackupAndRestore(tmp_path / "straight",
                                                      save_freq=save_freq)])
    with pytest.raises(Interrupt):
        make_model().fit(**make_input(), epochs=epochs, verbose=0, callbacks=[
            ddl.callbacks.BackupAndRestore(tmp_path / "run", save_freq=save_freq,
                                           background=False),
            InterruptAt(stop_at)])
    resumed = make_model()
    backup = ddl.callbacks.BackupAndRestore(tmp_path / "run", save_freq=save_freq)
    history = resumed.fit(**make_input(), epochs=epochs, verbose=0, callbacks=[backup])
    return (straight_model, straight_history), (resumed, history), backup


def test_arrays_resume_mid_epoch_bitwise(tmp_path):
    # shuffle="batch" (the order of the batches): True is tests/mpi/test_resume_mpi.py's.
    x, y = data()
    (straight, h1), (resumed, h2), backup = fit_interrupted_then_resumed(
        tmp_path, lambda: dict(x=x, y=y, batch_size=BATCH, shuffle="batch"), stop_at=8)
    # Saved every 3 batches: after batches 3 and 6 of 15; 6 = epoch 1, batch 1.
    assert backup.position.epoch == 1 and backup.position.step == 1
    assert backup.position.samples == BATCH and backup.position.input == "arrays"
    assert digest(resumed) == digest(straight)
    # The resumed epoch's metrics go on from the backup's running state.
    assert h2.history["loss"] == h1.history["loss"][1:]
    assert h2.history["mae"] == h1.history["mae"][1:]


def test_the_arrays_order_depends_on_the_seed_and_the_epoch_only(tmp_path):
    x, y = data()
    ids = np.arange(SAMPLES, dtype=np.float32)[:, None] * np.ones((1, FEATURES), np.float32)
    seen = []

    class Record(keras.layers.Layer):
        def call(self, inputs, training=False):
            if training:
                tf.py_function(lambda v: seen.append(v.numpy()[:, 0].astype(int).tolist()),
                               [inputs], [])
            return inputs

    def model():
        m = keras.Sequential([keras.Input((FEATURES,)), Record(), keras.layers.Dense(3)])
        m.compile("sgd", "mse", run_eagerly=True)
        return m

    backup = ddl.callbacks.BackupAndRestore(tmp_path / "b", save_freq=100)
    model().fit(ids, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[backup])
    first = list(seen)
    seed = backup.position.shuffle_seed
    expected = [np.asarray(ddl.data.epoch_order(SAMPLES, e, seed)).reshape(-1, BATCH).tolist()
                for e in range(2)]
    assert first == expected[0] + expected[1]
    assert sorted(sum(first[:5], [])) == list(range(SAMPLES))
    assert first[:5] != first[5:]   # reshuffled each epoch


def test_tf_data_resumes_at_an_epoch_start_with_the_epochs_own_shuffle(tmp_path):
    # Saved after batch 10 = the end of epoch 1: the resumed run makes a new
    # iterator for epoch 2, which must reshuffle as the uninterrupted run's did.
    x, y = data()

    def make_input():
        return dict(x=tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=1)
                    .batch(BATCH))

    (straight, _), (resumed, _), backup = fit_interrupted_then_resumed(
        tmp_path, make_input, stop_at=12, save_freq=5)
    assert (backup.position.epoch, backup.position.step) == (2, 0)
    assert digest(resumed) == digest(straight)


def test_an_endless_tf_data_input_with_steps_per_epoch_resumes_bitwise(tmp_path):
    x, y = data()

    def make_input():
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=2).repeat()
        return dict(x=ds.batch(BATCH), steps_per_epoch=4)

    (straight, _), (resumed, _), backup = fit_interrupted_then_resumed(
        tmp_path, make_input, stop_at=7)
    assert (backup.position.epoch, backup.position.step) == (1, 2)
    assert digest(resumed) == digest(straight)


def test_a_generator_warns_at_the_start_and_resumes_at_the_epoch_start(tmp_path, capfd):
    x, y = data()

    def make_input():
        def batches():
            while True:
                for i in range(0, SAMPLES, BATCH):
                    yield x[i:i + BATCH], y[i:i + BATCH]
        return dict(x=batches(), steps_per_epoch=SAMPLES // BATCH)

    _, (resumed, history), backup = fit_interrupted_then_resumed(tmp_path, make_input,
                                                                 stop_at=8, straight=False)
    err = capfd.readouterr().err
    assert "the input (a Python generator) cannot be positioned: a run resumed from a " \
           "backup taken within an epoch starts that epoch at its first batch" in err
    assert "epoch 1 starts over at its first batch from the state after its batch 1" in err
    assert (backup.position.epoch, backup.position.step) == (1, 0)
    # Epoch 1 again in full, then epoch 2: 6 + 10 steps after the backup's 6.
    assert int(resumed.optimizer.iterations.numpy()) == 6 + 10
    assert len(history.history["loss"]) == 2


def test_a_tf_data_pipeline_tensorflow_cannot_save_warns_and_restarts_the_epoch(tmp_path,
                                                                               capfd):
    x, y = data()

    def make_input():
        ds = tf.data.Dataset.range(SAMPLES // BATCH).map(
            lambda i: tf.py_function(lambda j: (x[j * BATCH:(j + 1) * BATCH],
                                                y[j * BATCH:(j + 1) * BATCH]),
                                     [i], [tf.float32, tf.float32]))
        return dict(x=ds.map(lambda a, b: (tf.ensure_shape(a, [BATCH, FEATURES]),
                                            tf.ensure_shape(b, [BATCH, 3]))))

    _, (resumed, _), backup = fit_interrupted_then_resumed(tmp_path, make_input, stop_at=8,
                                                           straight=False)
    err = capfd.readouterr().err
    assert "TensorFlow cannot save this tf.data pipeline's iterator" in err
    assert "epoch 1 starts over at its first batch" in err
    assert (backup.position.epoch, backup.position.step) == (1, 0)


def test_background_writes_end_before_fit_returns(tmp_path):
    x, y = data()
    backup = ddl.callbacks.BackupAndRestore(tmp_path / "b", save_freq=2, keep=3)
    make_model().fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[backup])
    # Every 2 batches of 10, and the end of fit: the last three kept.
    assert [key for key, _ in backup.backups()] == [(1, 1), (1, 3), (2, 0)]
    assert not [n for n in os.listdir(tmp_path / "b") if n.startswith(".partial")]


def test_a_parallel_map_after_a_batch_over_a_reshuffle_is_detected():
    # TensorFlow 2.21 restores such a pipeline's iterator with the shuffle's
    # seed generator one draw ahead (seen in a fresh process only): the
    # epochs after a resumed one are then shuffled differently, and
    # BackupAndRestore warns. A map that tf.data's optimizer makes parallel
    # does the same, so BackupAndRestore turns that rewrite off;
    # tests/mpi/test_resume_mpi.py resumes such pipelines (DDLStrategy's split
    # is a map after the batch) bitwise.
    from keras_ddl.keras.fit_input import reshuffle_ahead_risk, without_map_parallelization

    def pipeline(*ops, reshuffle=True):
        ds = tf.data.Dataset.range(20).shuffle(20, seed=5, reshuffle_each_iteration=reshuffle)
        for op in ops:
            ds = op(ds)
        return ds

    batch = lambda ds: ds.batch(5)  # noqa: E731
    pmap = lambda ds: ds.map(lambda v: v + 1, num_parallel_calls=2)  # noqa: E731
    plain_map = lambda ds: without_map_parallelization(ds.map(lambda v: v + 1))  # noqa: E731
    assert reshuffle_ahead_risk(pipeline(batch, pmap))
    assert reshuffle_ahead_risk(pipeline(batch, lambda ds: ds.filter(lambda v: True), pmap,
                                         lambda ds: ds.prefetch(1)))
    assert not reshuffle_ahead_risk(pipeline(pmap, batch))
    assert not reshuffle_ahead_risk(pipeline(batch, plain_map))
    assert not reshuffle_ahead_risk(pipeline(batch, pmap, reshuffle=False))
    options = pipeline(batch, plain_map).options().experimental_optimization
    assert options.map_parallelization is False
