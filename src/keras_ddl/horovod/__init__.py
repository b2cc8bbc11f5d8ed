"""Horovod's API over keras_ddl: a Horovod script runs after changing its
import line only.

    import horovod.tensorflow.keras as hvd   ->  import keras_ddl.horovod.tensorflow.keras as hvd
    import horovod.tensorflow as hvd         ->  import keras_ddl.horovod.tensorflow as hvd
    import horovod.keras as hvd              ->  import keras_ddl.horovod.keras as hvd

Names, argument names, their order and defaults are Horovod 0.28's.
Arguments without a meaning here (devices, name scopes) are accepted and
ignored; the ones keras_ddl cannot honour (Adasum, explicit gradient
groups, a process set for the optimizer or tape, TF1 sessions) raise
NotImplementedError naming the argument. Process sets are keras_ddl's: the
collectives take `process_set=`, and `root_rank` is a world rank in it.
docs/horovod.md lists what differs on purpose.
"""
