"""Loss scaling (``mixed_float16``) that cannot split the ranks.

Keras' ``LossScaleOptimizer`` checks whether the gradients it is given are
finite and, if not, skips the step: its inner optimizer's ``apply`` runs
inside a ``cond`` on that check. When the gradients are still rank-local at
that point, one rank can see an ``inf`` the others do not, skip, and never
join the gradient allreduce that the others, inside the ``cond``, wait in.
That happens in two layouts:

* ``LossScaleOptimizer(DistributedOptimizer(opt))``, which
  ``model.compile`` builds by itself under ``mixed_float16`` (its
  ``auto_scale_loss=True`` default);
* ``LossScaleOptimizer(opt)`` under ``DDLStrategy``, where the gradients are
  summed inside ``opt.apply``.

``install()`` (called when a ``DistributedOptimizer`` or a ``DDLStrategy`` is
made) wraps ``LossScaleOptimizer.apply`` so that, in those layouts, the
gradients are reduced *before* the finiteness check, outside the ``cond``:
every rank then checks the same reduced gradients, takes the same branch,
and the reduction still overlaps the backward pass. The reduction inside the
branch is skipped (the gradients already are the reduced ones). A
``DistributedOptimizer`` with ``gradient_accumulation_steps > 1`` reduces
only every k-th step, so there the ranks instead agree on the check itself
(one small allreduce of the "all finite" flag: a step is skipped everywhere
if it is non-finite anywhere). Every other use of ``LossScaleOptimizer``,
including ``DistributedOptimizer(LossScaleOptimizer(opt))`` (which already
reduces first), is left exactly as Keras does it.
"""

import contextlib
import threading

import keras
import tensorflow as tf

from ..common import basics
from ..tensorflow.collectives import allreduce
from ..tensorflow.arguments import Min

# The method by which an optimizer or a strategy reduces gradients for a
# LossScaleOptimizer around it: (grads, variables) -> (reduced grads, a
# context manager in which they are taken as reduced), or None when the
# ranks must agree on the finiteness check instead.
REDUCE_AHEAD = "reduce_ahead_of_loss_scale"

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


@contextlib.contextmanager
def _agreeing_on_finiteness():
    _local.agree = getattr(_local, "agree", 0) + 1
    try:
        yield
    finally:
        _local.agree -= 1


def _agreed(finite):
    # Min over ranks of "all finite": 1 only if every rank's gradients are.
    flag = allreduce(tf.cast(finite, tf.int32), op=Min)
    return tf.cast(flag, tf.bool)


def _reducer(optimizer):
    """What reduces this LossScaleOptimizer's gradients across ranks and can
    do it ahead of the finiteness check: its inner optimizer (through other
    LossScaleOptimizers), else the running replica strategy's extended
    object; None when neither offers ``reduce_ahead_of_loss_scale``
    (DistributedOptimizer and DDLStrategy do)."""
    inner = optimizer.inner_optimizer
    while isinstance(inner, keras.optimizers.LossScaleOptimizer):
        inner = inner.inner_optimizer
    if hasattr(inner, REDUCE_AHEAD):
        return inner
    strategy = getattr(tf.distribute.get_replica_context(), "strategy", None)
    extended = getattr(strategy, "extended", None)
    return extended if hasattr(extended, REDUCE_AHEAD) else None


def _apply(original, optimizer, grads, trainable_variables):
    if basics.size() == 1:
        return original(optimizer, grads, trainable_variables)
    reducer = _reducer(optimizer)
    if reducer is None:
        return original(optimizer, grads, trainable_variables)
    ahead = getattr(reducer, REDUCE_AHEAD)(list(grads), trainable_variables)
    if ahead is None:
        with _agreeing_on_finiteness():
            return original(optimizer, grads, trainable_variables)
    reduced, taken_as_reduced = ahead
    with taken_as_reduced:
        return original(optimizer, reduced, trainable_variables)


def install():
    """Wraps ``keras.optimizers.LossScaleOptimizer`` once per process."""
    global _installed
    with _install_lock:
        if _installed:
            return
        cls = keras.optimizers.LossScaleOptimizer
        original_apply, original_check = cls.apply, cls.check_finite

        def apply(self, grads, trainable_variables=None):
            return _apply(original_apply, self, grads, trainable_variables)

        def check_finite(self, grads):
            finite = original_check(self, grads)
            return _agreed(finite) if getattr(_local, "agree", 0) else finite

        apply.__wrapped__ = original_apply
        check_finite.__wrapped__ = original_check
        apply.__doc__, check_finite.__doc__ = original_apply.__doc__, original_check.__doc__
        cls.apply, cls.check_finite = apply, check_finite
        _installed = True
