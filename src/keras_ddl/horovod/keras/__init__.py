"""`horovod.keras` over keras_ddl: the same module as
`keras_ddl.horovod.tensorflow.keras` (Keras 3 is tf.keras's successor).

    import keras_ddl.horovod.keras as hvd   # was: import horovod.keras as hvd
"""

from keras_ddl.horovod.tensorflow.keras import *  # noqa: F401,F403
from keras_ddl.horovod.tensorflow.keras import (  # noqa: F401
    DistributedOptimizer, PartialDistributedOptimizer, allgather, allreduce, broadcast,
    broadcast_global_variables, load_model, reducescatter)

# This package's own callbacks module (the same classes), so that
# `import keras_ddl.horovod.keras.callbacks` finds a file as Horovod's did.
from . import callbacks  # noqa: F401,E402
