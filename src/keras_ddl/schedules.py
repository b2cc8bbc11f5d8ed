# keras_ddl.schedules: the public name of keras/schedules.py, where the code
# lives. The classes keep their Keras registration names (keras_ddl>WarmUp,
# ...), so saved models load whichever module path they name.
from .keras import schedules as _layer
from ._reexport import re_export as _re_export

_re_export(globals(), _layer)
