# keras_ddl.callbacks: the public name of keras/callbacks.py, where the code
# lives.
from .keras import callbacks as _layer
from ._reexport import re_export as _re_export

_re_export(globals(), _layer)
