"""`horovod.tensorflow.keras.callbacks` over keras_ddl.callbacks (Horovod's
argument names and order; `device` is accepted and ignored)."""

from keras_ddl.keras import callbacks as _ddl_callbacks


class BroadcastGlobalVariablesCallback(_ddl_callbacks.BroadcastGlobalVariablesCallback):
    """Makes every rank start from `root_rank`'s model and optimizer state.

    Args:
        root_rank: The rank whose values every rank takes.
        device: Ignored.
        local_variables: Variables that are not broadcast (each rank keeps its own).
    """

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__(root_rank=root_rank, local_variables=local_variables)


class MetricAverageCallback(_ddl_callbacks.MetricAverageCallback):
    """Averages the epoch-end metrics over ranks.

    Args:
        device: Ignored.
    """

    def __init__(self, device=''):
        super().__init__()


class LearningRateScheduleCallback(_ddl_callbacks.LearningRateScheduleCallback):
    """Sets the learning rate to `initial_lr * multiplier` from `start_epoch`
    to `end_epoch` (Horovod's argument order)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__(initial_lr, multiplier, start_epoch=start_epoch, end_epoch=end_epoch,
                         staircase=staircase, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)


class LearningRateWarmupCallback(_ddl_callbacks.LearningRateWarmupCallback):
    """Warms the learning rate up from `initial_lr / size()` to `initial_lr`
    over `warmup_epochs` (Horovod's argument order)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        super().__init__(initial_lr, warmup_epochs=warmup_epochs, steps_per_epoch=steps_per_epoch,
                         momentum_correction=momentum_correction, verbose=verbose)


def BestModelCheckpoint(monitor='val_loss', verbose=0, mode='auto', save_freq='epoch'):
    """Not supported (it serves Horovod's Spark estimators): raises
    NotImplementedError. Use keras_ddl.callbacks.on_rank(0,
    keras.callbacks.ModelCheckpoint(path, save_best_only=True))."""
    raise NotImplementedError("keras_ddl.horovod: BestModelCheckpoint is not supported; use "
                              "keras_ddl.callbacks.on_rank(0, keras.callbacks.ModelCheckpoint("
                              "path, monitor=..., save_best_only=True))")
