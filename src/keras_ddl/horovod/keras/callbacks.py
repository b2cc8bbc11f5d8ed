"""`horovod.keras.callbacks` over keras_ddl: the classes of
`keras_ddl.horovod.tensorflow.keras.callbacks`, under the module path that
`import horovod.keras.callbacks` had, so both names give the same classes."""

from keras_ddl.horovod.tensorflow.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint, BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, MetricAverageCallback)
