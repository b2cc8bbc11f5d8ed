"""`horovod.keras` over keras_ddl: the same module as
`keras_ddl.horovod.tensorflow.keras` (Keras 3 is tf.keras's successor).

    import keras_ddl.horovod.keras as hvd   # was: import horovod.keras as hvd
"""

from keras_ddl.horovod.tensorflow.keras import *  # noqa: F401,F403
from keras_ddl.horovod.tensorflow.keras import (  # noqa: F401
    DistributedOptimizer, PartialDistributedOptimizer, allgather, allreduce, broadcast,
    broadcast_global_variables, callbacks, load_model, reducescatter)

import sys as _sys

# `import keras_ddl.horovod.keras.callbacks` is the same module as hvd.callbacks.
_sys.modules[__name__ + ".callbacks"] = callbacks
