"""The DDL_* settings table (custom_ops/common/settings.def) as the launcher
needs it: each variable's range or choices, read without TensorFlow or the
core's library. The core compiles the same file (custom_ops/common/
config.cc), so ddlrun's checks and the core's cannot drift apart. The build
copies it beside the compiled libraries in the package; a source checkout
reads it where it is."""

import importlib.util
import os
import re
from collections import namedtuple


def _table():
    """Installed: the build's copy beside keras_ddl's libraries (found
    without importing keras_ddl, which would import TensorFlow). A source
    checkout that was not built: the table itself."""
    spec = importlib.util.find_spec("keras_ddl")
    packages = list(spec.submodule_search_locations) if spec else []
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [os.path.join(p, "settings.def") for p in packages] + [
        os.path.join(checkout, "custom_ops", "common", "settings.def")]
    return next((p for p in candidates if os.path.exists(p)), candidates[0])


TABLE = _table()

# kind: "number", "whole", "choice" or "text"; low and high bound a number;
# choices lists a choice's words; shared: every rank must use the same value.
Setting = namedtuple("Setting", "variable kind low high choices expected shared")

_ROW = re.compile(r"^DDL_(NUMBER|WHOLE|CHOICE|TEXT)\((.*)\)\s*$")
_FIELD = re.compile(r'\s*("[^"]*"|[^,"]+)\s*(?:,|$)')


def load(path=TABLE):
    """{variable: Setting}, in the table's order."""
    settings = {}
    with open(path) as f:
        for line in f:
            row = _ROW.match(line.strip())
            if not row:
                continue
            kind = row.group(1).lower()
            fields = [f.strip('"') for f in _FIELD.findall(row.group(2))]
            var, scope, expected = fields[0], fields[-1], fields[-2]
            low = high = choices = None
            if kind in ("number", "whole"):
                low, high = float(fields[2]), float(fields[3])
            elif kind == "choice":
                choices = tuple(fields[2].split())
            settings[var] = Setting(var, kind, low, high, choices, expected, scope == "SHARED")
    return settings


SETTINGS = load()


def valid(variable, value):
    """True when the number `value` is a valid value of `variable`."""
    s = SETTINGS[variable]
    return s.low <= value <= s.high and (s.kind != "whole" or value == int(value))
