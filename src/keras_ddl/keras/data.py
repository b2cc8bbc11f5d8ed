"""Input pipeline for ImageNet-style TFRecords, sharded across ranks.

Data layout (the usual ImageNet TFRecord layout): files named
``<split>-NNNNN-of-MMMMM`` in one directory, each a TFRecord of
``tf.train.Example`` with

- ``image/encoded``: JPEG bytes (string)
- ``image/class/label``: class index (int64)

``examples/convert_image_folder.py`` writes this layout from a
folder-per-class image tree (labels 0..K-1 in sorted folder order).

```python
ds = keras_ddl.data.imagenet_dataset("/data/imagenet", "train", image_size=224,
                                     batch_size=256, training=True)
```

Each rank reads the files ``files[rank::size]`` (at least one file per
rank), decodes in parallel, applies random-resized-crop + horizontal flip
(training) or resize + center crop (evaluation), batches (``batch_size``
is the per-rank batch) and prefetches.

Sample positions, for inputs that must survive a restart at another world
size (see ``keras_ddl.keras.checkpoint``): ``epoch_order`` is the global order
of an epoch's samples (a permutation of ``(seed, epoch)``), ``rows_of_rank``
is the rank's share of a global batch (DDLStrategy's split), and
``sample_index_dataset`` gives a rank the sample indices of every step from a
backup's position on, so that the interrupted epoch sees each of its samples
once whatever the world size of either run:

```python
backup = ddl.callbacks.BackupAndRestore("/shared/run1/backup", save_freq=100)
ds = ddl.data.sample_index_dataset(len(x), global_batch=256, seed=1, backup=backup)
ds = ds.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
model.fit(ds, epochs=90, steps_per_epoch=len(x) // 256, callbacks=[backup, ...])
```
"""

import glob
import os
import sys

import tensorflow as tf

MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def list_files(data_dir, split):
    """Sorted TFRecord files of one split (``<split>-*`` in ``data_dir``)."""
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*")))
    if not files:
        raise FileNotFoundError(
            f"keras_ddl.data: no files matching {split}-* in {data_dir!r} "
            "(convert an image tree with examples/convert_image_folder.py)")
    return files


def shard_files(files, rank, size):
    """The files of one rank: ``files[rank::size]``. Needs len(files) >= size."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"keras_ddl.data: bad rank {rank} / size {size}")
    if len(files) < size:
        raise ValueError(
            f"keras_ddl.data: {len(files)} files cannot be sharded over {size} ranks; "
            "write at least one shard per rank (--num-shards of the converter)")
    return list(files[rank::size])


def parse_example(serialized):
    """(jpeg bytes, int32 label) of one serialized Example."""
    f = tf.io.parse_single_example(serialized, FEATURES)
    return f["image/encoded"], tf.cast(f["image/class/label"], tf.int32)


def decode_random_crop(image_bytes, image_size, area_range=(0.08, 1.0),
                       aspect_ratio_range=(3 / 4, 4 / 3), seed=None):
    """Random-resized crop (Inception style), decoding only the crop window."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    bbox = tf.zeros([1, 0, 4], tf.float32)  # whole image
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=bbox, min_object_covered=0.1,
        aspect_ratio_range=aspect_ratio_range, area_range=area_range,
        max_attempts=10, use_image_if_no_bounding_boxes=True, seed=seed or 0)
    offset_y, offset_x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(size)
    window = tf.stack([offset_y, offset_x, h, w])
    image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
    return tf.image.resize(image, [image_size, image_size], method="bilinear")


def decode_center_crop(image_bytes, image_size, crop_padding=32):
    """Center crop of side ``image_size / (image_size + crop_padding)`` of the
    shorter edge, resized to ``image_size`` (deterministic)."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    h, w = shape[0], shape[1]
    frac = image_size / (image_size + crop_padding)
    crop = tf.cast(frac * tf.cast(tf.minimum(h, w), tf.float32), tf.int32)
    crop = tf.maximum(crop, 1)
    offset_y = (h - crop + 1) // 2
    offset_x = (w - crop + 1) // 2
    window = tf.stack([offset_y, offset_x, crop, crop])
    image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
    return tf.image.resize(image, [image_size, image_size], method="bilinear")


def normalize(image, dtype=tf.float32):
    """Subtracts ImageNet's per-channel mean and divides by its standard
    deviation (MEAN_RGB, STDDEV_RGB, on the 0-255 scale), then casts.

    Args:
        image: An RGB image tensor with values in 0-255, channels last.
        dtype: The dtype of the result.
    """
    image = (image - tf.constant(MEAN_RGB, image.dtype)) / tf.constant(STDDEV_RGB, image.dtype)
    return tf.cast(image, dtype)


def preprocess(image_bytes, image_size, training, dtype=tf.float32, seed=None):
    """Decodes a JPEG into a normalized `image_size` square: in training a
    random crop and a random left-right flip, else the center crop.

    Args:
        image_bytes: The encoded image, a scalar string tensor.
        image_size: The side of the square output, in pixels.
        training: Whether to augment (random crop and flip).
        dtype: The dtype of the result.
        seed: The seed of the random crop and flip, or None.
    """
    if training:
        image = decode_random_crop(image_bytes, image_size, seed=seed)
        image = tf.image.random_flip_left_right(image, seed=seed)
    else:
        image = decode_center_crop(image_bytes, image_size)
    image = tf.ensure_shape(image, [image_size, image_size, 3])
    return normalize(image, dtype)


def _rank_size(rank, size):
    if rank is None or size is None:
        from ..common import basics
        rank = basics.rank() if rank is None else rank
        size = basics.size() if size is None else size
    return rank, size


def imagenet_dataset(data_dir, split, image_size, batch_size, training, rank=None, size=None,
                     shuffle_buffer=10000, repeat=None, dtype=tf.float32, seed=None,
                     drop_remainder=True, cycle_length=4):
    """A batched, prefetched ``(images, labels)`` dataset of this rank's shards.

    Args:
        data_dir, split: TFRecords ``data_dir/<split>-*``.
        image_size: Output side (square images, channels last).
        batch_size: Per-rank batch size.
        training: Random-resized-crop + flip and shuffling (True), or resize
            + center crop in file order (False).
        rank, size: Which shard; default ``keras_ddl.rank()/size()``.
        repeat: Repeat forever (default: ``training``).
        dtype: Image dtype (``tf.bfloat16`` for mixed precision input).
    """
    rank, size = _rank_size(rank, size)
    files = shard_files(list_files(data_dir, split), rank, size)
    repeat = training if repeat is None else repeat
    auto = tf.data.AUTOTUNE
    ds = tf.data.Dataset.from_tensor_slices(files)
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
                       cycle_length=min(cycle_length, len(files)), num_parallel_calls=auto,
                       deterministic=not training)
    if training and shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    if repeat:
        ds = ds.repeat()

    def fn(serialized):
        image_bytes, label = parse_example(serialized)
        return preprocess(image_bytes, image_size, training, dtype, seed), label

    ds = ds.map(fn, num_parallel_calls=auto, deterministic=not training)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    options = tf.data.Options()
    # Sharding is done here by file; keep tf.distribute from re-sharding.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(options)
    return ds.prefetch(auto)


def synthetic_dataset(image_size, num_classes, batch, dtype=tf.float32, seed=0):
    """An endless dataset repeating one random batch of the right shape:
    images ``(batch, image_size, image_size, 3)``, int32 labels in
    ``[0, num_classes)``. For benchmarking without the data set."""
    g = tf.random.Generator.from_seed(seed)
    images = tf.cast(g.normal([batch, image_size, image_size, 3]), dtype)
    labels = g.uniform([batch], 0, num_classes, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensors((images, labels)).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------- sample positions

def rows_of_rank(global_batch, rank=None, size=None):
    """``(first_row, rows)`` of a rank's share of a global batch.

    The rule every keras_ddl input follows (DDLStrategy's split of a global
    batch, ``sample_index_dataset``, the arrays ``fit`` is given under a
    ``BackupAndRestore``): contiguous rows, as even as possible, the first
    ``global_batch % size`` ranks taking one row more.
    """
    rank, size = _rank_size(rank, size)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"keras_ddl.data: bad rank {rank} / size {size}")
    base, extra = divmod(int(global_batch), size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


_uneven_warned = set()


def warn_uneven_global_batch(global_batch, size=None, why=""):
    """Prints, once per (global batch, size), what happens when a global
    batch does not divide over the ranks: the global batch, the steps per
    epoch and the learning rate stay; the first ``global_batch % size``
    ranks take one row more of each step. Returns True if it does not divide."""
    _, size = _rank_size(0, size)
    base, extra = divmod(int(global_batch), size)
    if not extra:
        return False
    if (global_batch, size) not in _uneven_warned:
        _uneven_warned.add((global_batch, size))
        from ..common import basics
        more = f"ranks 0-{extra - 1} take" if extra > 1 else "rank 0 takes"
        sys.stderr.write(
            f"[keras_ddl] rank {basics.rank()}: the global batch of {global_batch} rows does not "
            f"divide over {size} ranks{why}: {more} {base + 1} rows of each step, the "
            f"others {base}. The global batch, the steps per epoch and the learning rate are "
            f"unchanged; each rank's mean loss counts equally, so a sample on a rank with "
            f"{base} rows weighs {base + 1}/{base} of one on a rank with {base + 1}.\n")
        sys.stderr.flush()
    return True


def _positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"keras_ddl.data: {name} must be an int >= {minimum}, got {value!r}")
    return value


def epoch_order(num_samples, epoch, seed=0, shuffle=True):
    """The order of an epoch's samples: an int64 tensor, a permutation of
    ``range(num_samples)`` that depends on ``(seed, epoch)`` only (the same
    in every process and at every world size; TensorFlow's stateless
    shuffle). ``shuffle=False``: in order."""
    num_samples = _positive_int("num_samples", num_samples)
    order = tf.range(num_samples, dtype=tf.int64)
    if shuffle is True:
        seed_pair = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.random.experimental.stateless_shuffle(order, seed=seed_pair)
    return order


def sample_index_dataset(num_samples, global_batch, seed=0, shuffle=True, backup=None,
                         start_epoch=0, start_sample=0, rank=None, size=None):
    """This rank's sample indices, step after step, epoch after epoch.

    Epoch ``e`` takes its samples in ``epoch_order(num_samples, e, seed,
    shuffle)``, ``num_samples // global_batch`` steps of ``global_batch``
    (the remainder is left out of that epoch); each element is the int64
    vector of this rank's rows of one step (``rows_of_rank``). The dataset
    is endless: give ``fit`` ``steps_per_epoch=num_samples // global_batch``.
    It is already this rank's share (auto-sharding off), so DDLStrategy
    takes it as the per-replica batch.

    Args:
        num_samples: Samples in the data set.
        global_batch: Samples per step over all ranks; it must not change
            between a backup and its resume.
        seed: Seed of every epoch's order (with the epoch).
        shuffle: Shuffle each epoch (True) or take the samples in order.
        backup: A ``keras_ddl.callbacks.BackupAndRestore``: start at its
            resume position (``resume_position()``) and tell it that the
            input is positioned by construction, so it saves no iterator
            state. The backup may have been written at another world size.
        start_epoch, start_sample: Where to start when ``backup`` is None
            (``start_sample`` a multiple of ``global_batch``).
        rank, size: Which share; default ``keras_ddl.rank()/size()``.
    """
    num_samples = _positive_int("num_samples", num_samples)
    global_batch = _positive_int("global_batch", global_batch)
    steps = num_samples // global_batch
    if steps < 1:
        raise ValueError(f"keras_ddl.data: global_batch {global_batch} is larger than the "
                         f"{num_samples} samples")
    if backup is not None:
        position = backup.use_positioned_input(global_batch)
        start_epoch, start_sample = position.epoch, position.samples
    start_epoch = _positive_int("start_epoch", start_epoch, 0)
    start_sample = _positive_int("start_sample", start_sample, 0)
    if start_sample % global_batch or start_sample >= steps * global_batch:
        raise ValueError(f"keras_ddl.data: start_sample {start_sample} is not the start of a "
                         f"step of {global_batch} samples within the {steps * global_batch} "
                         "samples of an epoch")
    rank, size = _rank_size(rank, size)
    first_row, rows = rows_of_rank(global_batch, rank, size)
    warn_uneven_global_batch(global_batch, size)

    def epoch_steps(epoch):
        order = epoch_order(num_samples, epoch, seed, shuffle)[:steps * global_batch]
        mine = tf.reshape(order, [steps, global_batch])[:, first_row:first_row + rows]
        first_step = tf.where(epoch == start_epoch, start_sample // global_batch, 0)
        return tf.data.Dataset.from_tensor_slices(mine[first_step:])

    ds = tf.data.Dataset.range(start_epoch, 2 ** 62).flat_map(epoch_steps)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)
