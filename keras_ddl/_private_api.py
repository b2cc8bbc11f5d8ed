"""Private TensorFlow and Keras APIs used outside DDLStrategy.

keras_ddl uses private APIs in two places only: ``strategy.py`` (the
tf.distribute internals DDLStrategy is built on) and this module (three
small touchpoints used by the optimizer wrapper, BackupAndRestore and
``on_rank``). Both were written against the versions in
``strategy.TESTED_TENSORFLOW`` / ``strategy.TESTED_KERAS``; each function
here says what it touches and what happens if that moves: a touchpoint that
is gone degrades to the documented fallback or raises a clear error, never
an AttributeError from deep inside Keras.

(``loss_scale.py`` wraps two public methods of ``LossScaleOptimizer``,
``apply`` and ``check_finite``, and relies on Keras calling the second from
the first; its tests fail if that changes.)
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
