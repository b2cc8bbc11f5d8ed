"""The input of the ``fit`` a BackupAndRestore runs in: what it is, where it
stands, and how the resumed epoch starts at the backup's batch.

Keras 3's ``fit`` walks its input through an epoch iterator
(``keras.src.trainers.epoch_iterator.EpochIterator``) that yields, for every
step, ``(first batch, last batch, data iterator)``; the train function takes
the step's batches from that data iterator. BackupAndRestore reaches the
epoch iterator from ``on_train_begin`` (``fit``'s local ``epoch_iterator``,
read from its frame: no callback API gives it) and replaces two methods of
that one object:

- ``_enumerate_iterator``: in the resumed epoch, the steps before the
  backup's batch are not yielded (no data is taken for them); the tf.data
  iterator of the resumed epoch is restored from its checkpoint first.
- ``_get_iterator`` (arrays only): the batches come from ``array_stream``,
  whose order is a function of (seed, epoch), so that a resumed run sees the
  batches an uninterrupted one would; Keras' own array shuffle draws from
  an unseeded op and would not.

These are private Keras APIs (tested with the versions in
``strategy.TESTED_KERAS``); where they are missing, the input is treated as
one that cannot be positioned (the resumed epoch starts over, with a
warning).

The kinds of input:

- ``ARRAYS`` (numpy arrays or dense tensors): positioned by construction;
  under DDLStrategy the batches are global, so the position holds at any
  world size.
- ``TF_DATA``: the tf.data iterator's checkpoint (TensorFlow's own), one per
  rank; it holds the rank's own share of the pipeline, so it is used at the
  same world size only.
- ``SCRIPT``: the script built its input from the backup's position
  (``keras_ddl.data.sample_index_dataset``); nothing is saved for it.
- ``OTHER`` (Python generators, ``PyDataset``, anything else): cannot be
  positioned; a resumed epoch starts at its first batch.
"""

import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

ARRAYS, TF_DATA, SCRIPT, OTHER = "arrays", "tf.data", "script", "other"


def find_epoch_iterator():
    """The epoch iterator of the ``fit`` this call is inside, or None."""
    try:
        from keras.src.trainers.epoch_iterator import EpochIterator
    except ImportError:
        return None
    frame = sys._getframe(1)
    while frame is not None:  # up the stack to fit's frame, a few calls away
        if frame.f_code.co_name == "fit":
            candidate = frame.f_locals.get("epoch_iterator")
            if isinstance(candidate, EpochIterator):
                return candidate
        frame = frame.f_back
    return None


def _adapter_kind(adapter):
    try:
        from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
        from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter
    except ImportError:
        return OTHER, "this Keras version's data adapters are unknown to keras_ddl"
    if isinstance(adapter, TFDatasetAdapter):
        return TF_DATA, None
    if isinstance(adapter, ArrayDataAdapter):
        leaves = tf.nest.flatten(getattr(adapter, "_inputs", None))
        dense = [x for x in leaves if x is not None]
        if dense and all(isinstance(x, (np.ndarray, tf.Tensor)) for x in dense):
            return ARRAYS, None
        return OTHER, "arrays other than numpy arrays and dense tensors"
    names = {"GeneratorDataAdapter": "a Python generator",
             "PyDatasetAdapter": "a keras.utils.PyDataset"}
    name = type(adapter).__name__
    return OTHER, names.get(name, f"a {name.replace('DataAdapter', '')} input")


_BATCHES = ("_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset")


def reshuffle_ahead_risk(dataset):
    """True if a parallel map is applied after a batch, over a shuffle that
    reshuffles each epoch: TensorFlow (2.21) restores such an iterator with
    the shuffle's seed generator one draw ahead, so the epochs after the
    restored one are shuffled as the uninterrupted run's next ones. Walks
    the pipeline through the datasets' ``_inputs()``."""
    def walk(ds, parallel_map_above, batch_under_parallel_map):
        name = type(ds).__name__
        if name == "_ShuffleDataset" and getattr(ds, "_reshuffle_each_iteration", False):
            return batch_under_parallel_map
        if name in _BATCHES and parallel_map_above:
            batch_under_parallel_map = True
        if name == "_ParallelMapDataset":
            parallel_map_above = True
        try:
            inputs = ds._inputs()
        except Exception:  # a dataset class without it: nothing known below
            return False
        return any(walk(i, parallel_map_above, batch_under_parallel_map) for i in inputs)

    return walk(dataset, False, False)


def without_map_parallelization(dataset):
    """The dataset with tf.data's automatic map parallelization off: a map it
    makes parallel after a batch has the restore problem above."""
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    return dataset.with_options(options)


def iterator_files(iterator):
    """TensorFlow's checkpoint of a tf.data iterator, as {file name: bytes}."""
    with tempfile.TemporaryDirectory(prefix="keras_ddl-iterator-") as directory:
        tf.train.Checkpoint(iterator=iterator).write(os.path.join(directory, "iterator"))
        files = {}
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb") as f:
                files[name] = f.read()
    return files


def restore_iterator(iterator, files):
    """Restores a tf.data iterator in place from ``iterator_files``' output."""
    with tempfile.TemporaryDirectory(prefix="keras_ddl-iterator-") as directory:
        for name, data in files.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        status = tf.train.Checkpoint(iterator=iterator).read(os.path.join(directory, "iterator"))
        status.assert_consumed()


def array_stream(inputs, num_samples, batch_size, shuffle, seed, epoch, batch):
    """The batches of arrays from batch ``batch`` of epoch ``epoch`` on,
    epoch after epoch, as Keras batches them (a last partial batch
    included). Epoch ``e``'s order depends on (seed, e) only: ``shuffle``
    True permutes the samples (``keras_ddl.data.epoch_order``), ``"batch"``
    the batches, False keeps the order."""
    from .data import epoch_order

    num_batches = -(-num_samples // batch_size)

    def epoch_batches(e):
        order = epoch_order(num_samples, e, seed, shuffle is True)
        ids = tf.range(num_batches, dtype=tf.int64)
        if shuffle == "batch":
            ids = tf.random.experimental.stateless_shuffle(
                ids, seed=tf.stack([tf.constant(seed, tf.int64), e]))
        ids = ids[tf.where(e == epoch, batch, 0):]
        return tf.data.Dataset.from_tensor_slices(ids).map(
            lambda i: order[i * batch_size:tf.minimum((i + 1) * batch_size, num_samples)])

    indices = tf.data.Dataset.range(epoch, 2 ** 62).flat_map(epoch_batches)
    data = tf.data.Dataset.from_tensors(inputs).repeat()

    def gather(index, arrays):
        return tf.nest.map_structure(lambda a: tf.gather(a, index), arrays)

    return tf.data.Dataset.zip((indices, data)).map(gather, num_parallel_calls=tf.data.AUTOTUNE)


class FitInput:
    """BackupAndRestore's handle on the input of one ``fit``.

    Args:
        epoch_iterator: ``fit``'s epoch iterator (``find_epoch_iterator``),
            or None if it could not be found.
        positioned_by_script: the script built the input from the backup's
            position (kind ``SCRIPT``).
        shuffle_seed: seed of the arrays' order.
    """

    def __init__(self, epoch_iterator, positioned_by_script, shuffle_seed):
        self.epoch_iterator = epoch_iterator
        self.shuffle_seed = int(shuffle_seed)
        self.why_not = None  # why an OTHER input cannot be positioned
        self.reshuffles_ahead = False  # see reshuffle_ahead_risk
        if positioned_by_script:
            self.kind = SCRIPT
        elif epoch_iterator is None:
            self.kind, self.why_not = OTHER, "out of reach: fit's epoch iterator was not found"
        else:
            self.kind, self.why_not = _adapter_kind(epoch_iterator.data_adapter)
        self.current = None          # the data iterator of the step running
        self.current_epoch = None    # the epoch it was made for
        self._epoch = None           # the epoch fit runs
        self.batches_done = 0        # batches taken in this fit (steps x steps_per_execution)
        self._start = None           # (epoch, batch) the arrays' stream starts this fit at
        self._skip_to = 0            # resumed epoch: steps before this batch are done
        self._state = None           # resumed epoch: tf.data iterator files to restore
        if epoch_iterator is not None:
            self._install()

    # --- what fit is given ----------------------------------------------------

    @property
    def fresh_iterator_each_epoch(self):
        """Keras makes a new data iterator every epoch unless steps_per_epoch
        is given (then one iterator runs through every epoch)."""
        return getattr(self.epoch_iterator, "steps_per_epoch", None) is None

    @property
    def num_batches(self):
        return getattr(self.epoch_iterator, "num_batches", None)

    def global_batch(self, strategy_shards):
        """Rows per step over all ranks, if the input says (arrays, or a
        tf.data dataset of static batch size), else None."""
        from ..common import basics

        adapter = getattr(self.epoch_iterator, "data_adapter", None)
        if self.kind == ARRAYS:
            rows = adapter._batch_size
        elif self.kind == TF_DATA:
            spec = tf.nest.flatten(adapter.get_tf_dataset().element_spec)[0]
            rows = spec.shape[0] if getattr(spec, "shape", None) is not None and \
                spec.shape.rank else None
        else:
            return None
        if rows is None:
            return None
        return int(rows) if strategy_shards else int(rows) * basics.size()

    def build_metrics(self, model):
        """Makes the compiled metrics' variables now (Keras makes them in the
        first step when no strategy is set), from the input's batch spec,
        so that their state can be restored. False if it cannot."""
        compiled = getattr(model, "_compile_metrics", None)
        if compiled is None or compiled.built:
            return True
        try:
            spec = self.epoch_iterator.data_adapter.get_tf_dataset().element_spec
            model._symbolic_build(data_batch=spec)
        except Exception:
            return False
        return compiled.built

    # --- positioning ------------------------------------------------------------

    def _install(self):
        epoch_iterator = self.epoch_iterator
        original = epoch_iterator._enumerate_iterator

        def enumerate_from_position():
            skip, self._skip_to = self._skip_to, 0
            state, self._state = self._state, None
            for first, last, iterator in original():
                if state is not None:  # the resumed epoch's own iterator
                    restore_iterator(iterator, state)
                    state = None
                self.current, self.current_epoch = iterator, self._epoch
                if first < skip:
                    continue
                yield first, last, iterator

        epoch_iterator._enumerate_iterator = enumerate_from_position
        if self.kind == ARRAYS:
            epoch_iterator._get_iterator = self._array_iterator
        if self.kind == TF_DATA and isinstance(epoch_iterator._get_iterator(), tf.data.Dataset):
            epoch_iterator._distributed_dataset = without_map_parallelization(
                epoch_iterator._distributed_dataset)
            self.reshuffles_ahead = reshuffle_ahead_risk(epoch_iterator._distributed_dataset)

    def begin_epoch(self, epoch):
        """fit starts `epoch` (the first one: where the arrays' stream starts
        unless a backup said)."""
        self._epoch = epoch
        if self._start is None:
            self._start = (epoch, 0)

    def _array_iterator(self):
        adapter = self.epoch_iterator.data_adapter
        per_epoch = adapter.num_batches
        start_epoch, start_batch = self._start or (0, 0)
        epoch, batch = divmod(start_epoch * per_epoch + start_batch + self.batches_done,
                              per_epoch)
        if not hasattr(self, "_tensors"):
            self._tensors = tf.nest.map_structure(tf.convert_to_tensor, _tuples(adapter._inputs))
        stream = array_stream(self._tensors, adapter._num_samples, adapter._batch_size,
                              adapter._shuffle, self.shuffle_seed, epoch, batch)
        return self.epoch_iterator._distribute_strategy.experimental_distribute_dataset(stream)

    def resume(self, epoch, step, iterator_state=None, iterator_epoch=None):
        """Makes the next epoch of fit start at batch ``step`` of ``epoch``.

        ``iterator_state``: the tf.data iterator's files, saved from the
        iterator of epoch ``iterator_epoch``. Restored into the resumed
        epoch's iterator, unless it is the spent iterator of the epoch
        before and Keras makes a fresh iterator per epoch: then into a
        throwaway one, which sets the dataset's reshuffling seeds to where
        the backup left them."""
        self._start = (epoch, step)
        self._skip_to = step
        if iterator_state is None:
            return
        if iterator_epoch != epoch and self.fresh_iterator_each_epoch:
            restore_iterator(iter(self.epoch_iterator._get_iterator()), iterator_state)
        else:
            self._state = iterator_state

    def iterator_state(self):
        """The tf.data iterator's checkpoint files, {} before the first step
        (raises if TensorFlow cannot save this pipeline)."""
        return {} if self.current is None else iterator_files(self.current)


def _tuples(structure):
    """Lists as tuples, as Keras' array adapter batches them."""
    if isinstance(structure, list):
        return tuple(_tuples(s) for s in structure)
    if isinstance(structure, tuple):
        return tuple(_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: _tuples(v) for k, v in structure.items()}
    return structure
