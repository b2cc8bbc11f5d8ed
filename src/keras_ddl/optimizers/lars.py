# keras_ddl.optimizers.lars: the module path of LARS in models saved before
# the code moved to keras/optimizers/lars.py.
from ..keras.optimizers import lars as _layer
from .._reexport import re_export as _re_export

_re_export(globals(), _layer)
