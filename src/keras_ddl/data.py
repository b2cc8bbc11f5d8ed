# keras_ddl.data: the public name of keras/data.py, where the code lives.
from .keras import data as _layer
from ._reexport import re_export as _re_export

_re_export(globals(), _layer)
