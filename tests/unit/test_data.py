"""keras_ddl.data and examples/convert_image_folder.py in one process."""

import collections
import os
import sys

import numpy as np
import pytest

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
sys.path.insert(0, TESTS_DIR)
sys.path.insert(0, os.path.join(os.path.dirname(TESTS_DIR), "examples"))

tf = pytest.importorskip("tensorflow")
from image_tree import write_image_tree  # noqa: E402
import convert_image_folder  # noqa: E402
from keras_ddl import data  # noqa: E402

NUM_CLASSES, PER_CLASS, SHARDS = 3, 4, 4


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    out = tmp_path_factory.mktemp("records")
    write_image_tree(str(root), NUM_CLASSES, PER_CLASS)
    paths, label_map = convert_image_folder.convert(str(root), str(out), "train", SHARDS)
    return str(out), paths, label_map


def raw_examples(paths):
    rows = []
    for p in paths:
        for rec in tf.data.TFRecordDataset(p):
            ex = tf.train.Example.FromString(rec.numpy())
            f = ex.features.feature
            rows.append((f["image/class/label"].int64_list.value[0],
                         f["image/class/text"].bytes_list.value[0].decode(),
                         f["image/encoded"].bytes_list.value[0]))
    return rows


def test_converter_layout_and_label_map(records):
    out, paths, label_map = records
    assert [os.path.basename(p) for p in paths] == [
        f"train-{i:05d}-of-{SHARDS:05d}" for i in range(SHARDS)]
    assert label_map == {f"class_{c:02d}": c for c in range(NUM_CLASSES)}
    with open(os.path.join(out, "labels.txt")) as f:
        assert f.read().splitlines() == [f"{c}\tclass_{c:02d}" for c in range(NUM_CLASSES)]
    rows = raw_examples(paths)
    assert len(rows) == NUM_CLASSES * PER_CLASS
    assert collections.Counter(r[0] for r in rows) == {c: PER_CLASS for c in range(NUM_CLASSES)}
    for label, text, jpeg in rows:
        assert label_map[text] == label
        assert jpeg[:2] == b"\xff\xd8"   # PNG inputs were re-encoded to JPEG
        # The class colour survives the round trip (mean 40 + 80 * label).
        mean = float(tf.reduce_mean(tf.cast(tf.io.decode_jpeg(jpeg), tf.float32)))
        assert abs(mean - (40 + 80 * label)) < 8


def test_eval_pipeline_shapes_labels(records):
    out, _, _ = records
    ds = data.imagenet_dataset(out, "train", 24, batch_size=5, training=False, rank=0, size=1,
                               drop_remainder=False)
    images, labels = [], []
    for x, y in ds:
        assert x.dtype == tf.float32 and y.dtype == tf.int32
        assert x.shape[1:] == (24, 24, 3)
        images.append(x.numpy())
        labels.append(y.numpy())
    images, labels = np.concatenate(images), np.concatenate(labels)
    assert len(labels) == NUM_CLASSES * PER_CLASS
    assert collections.Counter(labels.tolist()) == {c: PER_CLASS for c in range(NUM_CLASSES)}
    # Normalised pixels still order by class.
    means = [images[labels == c].mean() for c in range(NUM_CLASSES)]
    assert means == sorted(means)


def test_eval_center_crop_is_deterministic(records):
    out, _, _ = records
    def run():
        ds = data.imagenet_dataset(out, "train", 16, batch_size=4, training=False, rank=0,
                                   size=1)
        return [(x.numpy(), y.numpy()) for x, y in ds]
    a, b = run(), run()
    assert len(a) == len(b) == NUM_CLASSES * PER_CLASS // 4
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_center_crop_geometry():
    # A 40x60 image whose centre 32x32 is white, rest black: the centre crop
    # of image_size 32, padding 8 (32/40 of the short side) is all white.
    img = np.zeros((40, 60, 3), np.uint8)
    img[4:36, 14:46] = 255
    jpeg = tf.io.encode_jpeg(img, quality=100)
    crop = data.decode_center_crop(jpeg, 32, crop_padding=8).numpy()
    assert crop.shape == (32, 32, 3)
    assert crop.min() > 200


def test_training_pipeline_shapes(records):
    out, _, _ = records
    ds = data.imagenet_dataset(out, "train", 20, batch_size=3, training=True, rank=1, size=2,
                               seed=1)
    for x, y in ds.take(6):   # repeats forever
        assert x.shape == (3, 20, 20, 3) and x.dtype == tf.float32
        assert y.shape == (3,) and y.dtype == tf.int32
        assert np.all((y.numpy() >= 0) & (y.numpy() < NUM_CLASSES))
    bf = data.imagenet_dataset(out, "train", 20, batch_size=3, training=True, rank=0, size=1,
                               dtype=tf.bfloat16)
    assert next(iter(bf))[0].dtype == tf.bfloat16


def test_sharding_by_rank_is_disjoint(records):
    out, paths, _ = records
    files = data.list_files(out, "train")
    assert files == sorted(paths)
    for size in (1, 2, 3, 4):
        shards = [data.shard_files(files, r, size) for r in range(size)]
        flat = [f for s in shards for f in s]
        assert sorted(flat) == files and len(set(flat)) == len(flat)
    with pytest.raises(ValueError, match="cannot be sharded"):
        data.shard_files(files, 0, 5)
    with pytest.raises(ValueError):
        data.shard_files(files, 2, 2)
    with pytest.raises(FileNotFoundError):
        data.list_files(out, "validation")
    # Per-rank datasets read disjoint examples that together are all of them.
    seen = []
    for r in range(2):
        ds = data.imagenet_dataset(out, "train", 8, 1, training=False, rank=r, size=2,
                                   drop_remainder=False)
        seen.append(sum(1 for _ in ds))
    assert sum(seen) == NUM_CLASSES * PER_CLASS


def test_synthetic_dataset():
    ds = data.synthetic_dataset(12, 7, 5)
    x, y = next(iter(ds))
    assert x.shape == (5, 12, 12, 3) and x.dtype == tf.float32
    assert y.shape == (5,) and y.dtype == tf.int32
    assert np.all((y.numpy() >= 0) & (y.numpy() < 7))
    x2, _ = next(iter(data.synthetic_dataset(12, 7, 5, dtype=tf.bfloat16)))
    assert x2.dtype == tf.bfloat16


def test_resnet_zero_gamma_and_kernel_only_decay():
    import keras
    import imagenet_common
    model = imagenet_common.build_resnet(keras, 14, 5, 32, width=0.125, l2=1e-4)
    bns = {l.name: l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)}
    last = [n for n in bns if n.endswith("_bn3")]
    assert len(last) == sum(imagenet_common.BLOCKS[14])
    for name, layer in bns.items():
        expected = 0.0 if name.endswith("_bn3") else 1.0
        assert np.all(layer.gamma.numpy() == expected), name
    for layer in model.layers:
        reg = getattr(layer, "kernel_regularizer", None)
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
            assert reg is not None, layer.name
            assert getattr(layer, "bias_regularizer", None) is None
    assert len(model.losses) == sum(isinstance(l, (keras.layers.Conv2D, keras.layers.Dense))
                                    for l in model.layers)
    assert model.output_shape == (None, 5)


# ---------------------------------------------------------------- sample positions

def test_rows_of_rank_splits_a_global_batch_as_ddl_strategy_does():
    assert [data.rows_of_rank(9, r, 2) for r in range(2)] == [(0, 5), (5, 4)]
    assert [data.rows_of_rank(8, r, 3) for r in range(3)] == [(0, 3), (3, 3), (6, 2)]
    assert [data.rows_of_rank(12, r, 4) for r in range(4)] == [(0, 3), (3, 3), (6, 3), (9, 3)]
    with pytest.raises(ValueError, match="bad rank 2 / size 2"):
        data.rows_of_rank(8, 2, 2)


def test_uneven_global_batch_warns_once_with_what_changed(capfd):
    assert data.warn_uneven_global_batch(10, 4) and data.warn_uneven_global_batch(10, 4)
    err = capfd.readouterr().err
    assert err.count("the global batch of 10 rows does not divide over 4 ranks: ranks 0-1 "
                     "take 3 rows of each step, the others 2. The global batch, the steps per "
                     "epoch and the learning rate are unchanged") == 1, err
    assert not data.warn_uneven_global_batch(12, 4)


def test_epoch_order_is_a_permutation_of_seed_and_epoch():
    a = data.epoch_order(50, 3, seed=7).numpy()
    assert sorted(a) == list(range(50))
    assert (a == data.epoch_order(50, 3, seed=7).numpy()).all()
    assert not (a == data.epoch_order(50, 4, seed=7).numpy()).all()
    assert not (a == data.epoch_order(50, 3, seed=8).numpy()).all()
    assert list(data.epoch_order(5, 3, shuffle=False).numpy()) == [0, 1, 2, 3, 4]


def steps_of(ds, n):
    return [v.numpy().tolist() for v in ds.take(n)]


def test_sample_index_dataset_resumed_at_another_size_sees_each_sample_once():
    samples, batch = 54, 9
    order = data.epoch_order(samples, 1, seed=3).numpy().reshape(6, 9).tolist()
    # 3 ranks from the start of epoch 1: each step's rows, rank by rank, are the order's.
    three = [steps_of(data.sample_index_dataset(samples, batch, seed=3, start_epoch=1,
                                                rank=r, size=3), 6) for r in range(3)]
    assert [sum((three[r][s] for r in range(3)), []) for s in range(6)] == order
    # Interrupted after 2 steps; 2 ranks take the rest of epoch 1 (5 + 4 rows), then epoch 2.
    two = [steps_of(data.sample_index_dataset(samples, batch, seed=3, start_epoch=1,
                                              start_sample=18, rank=r, size=2), 10)
           for r in range(2)]
    assert [len(ids) for ids in two[0]] == [5] * 10 and [len(ids) for ids in two[1]] == [4] * 10
    epoch1 = [i for r in range(3) for ids in three[r][:2] for i in ids] + \
        [i for r in range(2) for ids in two[r][:4] for i in ids]
    assert sorted(epoch1) == list(range(samples))
    epoch2 = [i for r in range(2) for ids in two[r][4:10] for i in ids]
    assert sorted(epoch2) == list(range(samples))
    assert two[0][4] + two[1][4] == data.epoch_order(samples, 2, seed=3).numpy()[:9].tolist()


@pytest.mark.parametrize("kwargs, named", [
    ({"num_samples": 0, "global_batch": 1}, "num_samples must be an int >= 1"),
    ({"num_samples": 5, "global_batch": 6}, "global_batch 6 is larger than the 5 samples"),
    ({"num_samples": 10, "global_batch": 2, "start_sample": 3},
     "start_sample 3 is not the start of a step of 2 samples"),
    ({"num_samples": 10, "global_batch": 2, "start_sample": 10},
     "start_sample 10 is not the start of a step"),
])
def test_sample_index_dataset_bad_arguments_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        data.sample_index_dataset(rank=0, size=1, **kwargs)
