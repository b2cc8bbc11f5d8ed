"""Private TensorFlow and Keras APIs: the full list, and where each is used.

keras_ddl is written against public APIs where they exist. Where none does,
the private touchpoint is named here, with the module that uses it and why
it is needed, so that a TensorFlow or Keras upgrade is checked against one
list. They were tested with the versions in ``strategy.TESTED_TENSORFLOW`` /
``strategy.TESTED_KERAS``; a DDLStrategy made on another version warns.

Behind functions of this module (each degrades to a documented fallback or
raises a clear error if its touchpoint moves, never an AttributeError from
deep inside Keras):

* ``tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext``:
  ``in_xla_context``, used by ``keras/distributed_optimizer.py`` to refuse ``jit_compile=True``
  with a readable message (the collectives have no XLA kernels).
* ``Model._initial_epoch`` (Keras 3 trainers): ``set_initial_epoch``, used by
  ``keras/checkpoint.py``'s BackupAndRestore to resume ``fit`` at the restored
  epoch, as Keras' own BackupAndRestore does.
* ``keras/fit_input.py`` (BackupAndRestore's handle on ``fit``'s input; its
  docstring details each): ``fit``'s local ``epoch_iterator`` (read from its
  frame), ``EpochIterator._enumerate_iterator`` / ``_get_iterator`` /
  ``data_adapter`` / ``steps_per_epoch`` and ``TFEpochIterator.
  _distributed_dataset`` / ``_distribute_strategy`` (replaced on that one
  object), the adapters' classes and ``ArrayDataAdapter``'s ``_inputs``,
  ``_batch_size``, ``_shuffle``, ``_num_samples``; ``Trainer._symbolic_build``
  and ``_compile_metrics`` (metric variables made before a restore);
  ``tf.data`` datasets' ``_inputs()`` and class names (the parallel-map check).
  Missing ones degrade to an input that cannot be positioned, with a warning.
* ``keras.src.backend.common.global_state`` and ``keras.src.random.
  seed_generator.global_seed_generator`` (``keras/checkpoint.py``): Keras'
  global seed generator, backed up and restored.
* The ``_is_default`` mark that ``keras.callbacks.CallbackList`` reads on a
  hook: ``is_default_hook`` / ``mark_default_hook``, used by ``keras/callbacks.py``
  (``on_rank``) so that wrapped callbacks keep Keras' fast path for hooks
  they do not override.
* ``tensorflow.python.autograph.impl.api.autograph_artifact``:
  ``skip_autograph``, used by ``collectives.py`` and ``variable_broadcast.py``
  (``broadcast_``) so AutoGraph leaves the collective wrappers alone without
  the public decorator's per-call cost. 

Used in place, because they are the extension points themselves:

* ``keras/strategy.py`` (DDLStrategy; its own docstring details each):
  ``tensorflow.python.distribute.one_device_strategy.OneDeviceExtended`` as
  the base of the extended object and its ``_create_variable``,
  ``_call_for_each_replica``, ``_reduce_to``, ``_batch_reduce_to``,
  ``_gather_to_implementation``, ``_distribute_datasets_from_function`` and
  other underscore hooks that ``tf.distribute.Strategy`` calls;
  ``tensorflow.python.distribute.input_util`` (device prefetching of the
  distributed dataset); ``tensorflow.python.trackable.base.
  CheckpointInitialValue`` (unwrapped before an initial value is
  broadcast); and ``keras.callbacks.CallbackList.__init__``, wrapped so that
  printing and file-writing callbacks run on rank 0 only: the wrapper reads
  the model's ``_distribute_strategy`` (Keras 3 keeps the strategy a model
  was built under there) and, on the other ranks, clears the list's
  ``_progbar`` (its own reference to the ProgbarLogger it adds) along with
  the dropped progress bar.
* ``keras/sync_batch_norm.py``: overrides ``BatchNormalization._moments`` and reads
  ``self._reduction_axes``, the one place Keras computes batch statistics;
  the override sums them over ranks before the normalisation.
* ``optimizers/lars.py``: overrides ``Optimizer._apply_weight_decay`` (LARS
  couples weight decay into its trust ratio, so the base class must not apply
  it again) and calls ``_use_weight_decay`` and ``_get_variable_index``, as
  Keras' own optimizers (``sgd.py``, ``lamb.py``) do.
* ``keras/distributed_optimizer.py``: DistributedOptimizer reads ``self._trainable_variables``
  and calls ``_get_variable_index`` (the Keras base class's variable index)
  to match gradients to accumulators and to locally-reduced variables.
* ``keras/loss_scale.py``: wraps the public ``LossScaleOptimizer.apply`` and
  ``check_finite`` and relies on Keras calling the second from the first;
  its tests fail if that changes.
"""

def in_xla_context():
    """True inside an XLA-compiled function (``jit_compile=True``).

    TensorFlow: ``tensorflow.python.ops.control_flow_util.
    GraphOrParentsInXlaContext``. If it moved, False: TensorFlow then
    reports the missing XLA kernel of our op itself.
    """
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))
    except Exception:
        return False


def set_initial_epoch(model, epoch):
    """Makes ``model.fit`` start at ``epoch`` (None: where its caller says).

    Keras 3 (``keras.src.trainers``): ``fit`` reads ``model._initial_epoch``
    after ``on_train_begin``, the way Keras' own BackupAndRestore resumes.
    """
    if not hasattr(model, "_initial_epoch"):
        raise RuntimeError(
            "keras_ddl: this Keras version's Model has no _initial_epoch, which "
            "BackupAndRestore uses to resume fit at the restored epoch (tested with Keras "
            "3.15); please report the Keras version")
    model._initial_epoch = epoch


# Keras 3 (keras.src.callbacks.CallbackList) looks for this attribute on a
# callback's hook to tell a hook left at its default (a no-op it may skip,
# or run without a background thread) from one a subclass overrides.
_DEFAULT_MARK = "_is_default"


def is_default_hook(method):
    return getattr(method, _DEFAULT_MARK, False)


def mark_default_hook(function):
    setattr(function, _DEFAULT_MARK, True)
    return function


def skip_autograph(function):
    """Makes AutoGraph call ``function`` as it is inside a ``tf.function``.

    TensorFlow (``tensorflow.python.autograph.impl.api``): AutoGraph never
    converts its own artifacts, which ``autograph_artifact`` marks with an
    attribute. The public ``tf.autograph.experimental.do_not_convert`` does
    the same through a wrapper that costs microseconds per eager call, which
    matters on a collective's small-message path. If the private helper is
    gone, the public decorator is the fallback.
    """
    try:
        from tensorflow.python.autograph.impl import api as autograph_api
        autograph_api.autograph_artifact(function)
        if autograph_api.is_autograph_artifact(function):
            return function
    except Exception:
        pass
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(function)
