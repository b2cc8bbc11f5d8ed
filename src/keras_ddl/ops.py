# keras_ddl.ops: the older name of the TensorFlow layer, keras_ddl.tensorflow
# (tensorflow/), kept for scripts that import it.
from . import tensorflow as _layer
from ._reexport import re_export as _re_export

_re_export(globals(), _layer)
