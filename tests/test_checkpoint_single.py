"""ddl.callbacks.BackupAndRestore in one process: arguments, pruning, and
falling back past a damaged backup. (Kill and resume across ranks:
tests/test_resume_mpi.py.)"""

import os

import keras
import numpy as np
import pytest

import keras_ddl as ddl
from keras_ddl.keras import checkpoint


def make_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 5)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32)


@pytest.mark.parametrize("kwargs, named", [
    ({"backup_dir": ""}, "backup_dir"),
    ({"backup_dir": "b", "keep": 0}, "keep"),
    ({"backup_dir": "b", "keep": True}, "keep"),
    ({"backup_dir": "b", "root_rank": 1}, "root_rank"),
])
def test_bad_arguments_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        ddl.callbacks.BackupAndRestore(**kwargs)


def test_keeps_the_newest_and_falls_back_past_a_damaged_one(tmp_path, capfd):
    x, y = data()
    backup = ddl.callbacks.BackupAndRestore(tmp_path / "b", keep=2)
    model = make_model()
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False, callbacks=[backup])
    assert [e for e, _ in backup.backups()] == [2, 3]
    assert sorted(os.listdir(tmp_path / "b")) == ["epoch-000002", "epoch-000003"]

    # Damage the newest backup's weights: its checksum no longer matches.
    weights = tmp_path / "b" / "epoch-000003" / "state.weights.h5"
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    weights.write_bytes(bytes(raw))

    resumed = make_model()
    again = ddl.callbacks.BackupAndRestore(tmp_path / "b", keep=2)
    history = resumed.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False,
                          callbacks=[again])
    assert again.restored_epoch == 2
    assert len(history.history["loss"]) == 1  # only epoch 3 was trained again
    assert "does not match the checksum" in capfd.readouterr().err
    # Epoch 3 redone from epoch 2's state gives epoch 3's weights again.
    for a, b in zip(model.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(resumed.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())
    # The rewritten epoch 3 verifies again; a later fit on the model starts
    # where its own arguments say (the restore does not stick).
    assert resumed._initial_epoch is None
    assert [e for e, _ in again.backups()] == [2, 3]


def test_every_backup_damaged_is_an_error(tmp_path):
    x, y = data()
    make_model().fit(x, y, batch_size=4, epochs=1, verbose=0,
                     callbacks=[ddl.callbacks.BackupAndRestore(tmp_path / "b")])
    (tmp_path / "b" / "epoch-000001" / "state.weights.h5").write_bytes(b"not hdf5")
    with pytest.raises(RuntimeError, match="none loads"):
        make_model().fit(x, y, batch_size=4, epochs=2, verbose=0,
                         callbacks=[ddl.callbacks.BackupAndRestore(tmp_path / "b")])


def test_a_full_disk_is_a_clear_error_and_the_previous_backup_stays(tmp_path, monkeypatch):
    # From epoch 2 on the disk has 10 KB free. (A disk that fills in the
    # middle of Keras' HDF5 write crashes the process inside h5py: the room
    # is checked before writing.)
    x, y = data()
    backup = ddl.callbacks.BackupAndRestore(tmp_path / "b")

    class DiskFills(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                monkeypatch.setattr(checkpoint, "_free_bytes", lambda directory: 10000)

    with pytest.raises(OSError, match=r"keras_ddl: BackupAndRestore could not write the "
                                      r"backup of epoch 2 in .*b on rank 0: No space left on "
                                      r"device: the backup needs about \d+ bytes, 10000 are "
                                      r"free; the previous backup .*epoch-000001 is intact"):
        make_model().fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False,
                         callbacks=[backup, DiskFills()])
    assert os.listdir(tmp_path / "b") == ["epoch-000001"]  # nothing half-written is left
    monkeypatch.undo()
    again = ddl.callbacks.BackupAndRestore(tmp_path / "b")
    make_model().fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False, callbacks=[again])
    assert again.restored_epoch == 1 and [e for e, _ in again.backups()] == [2, 3]
