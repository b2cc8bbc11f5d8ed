"""keras_ddl.optimizers: the public name of keras/optimizers/ (the layer
where the code lives), with the same objects. ``LARS`` keeps its Keras
registration name (keras_ddl>LARS), so a model saved with either module path
(keras_ddl.optimizers.lars or keras_ddl.keras.optimizers.lars) loads."""

from . import lars  # noqa: F401  (keras_ddl.optimizers.lars, the flat layout's path)
from .._reexport import re_export as _re_export
from ..keras import optimizers as _layer

_re_export(globals(), _layer)
