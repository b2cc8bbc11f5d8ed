"""The DDL_* settings table (custom_ops/common/settings.def) as the launcher
needs it: each variable's range or choices, read without TensorFlow or the
core's library. The core compiles the same file (custom_ops/common/
config.cc), so ddlrun's checks and the core's cannot drift apart. The build
copies it beside the compiled libraries in the package; a source checkout
reads it where it is."""

import os
import re
from collections import namedtuple

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Installed: the build's copy beside the libraries. A source checkout that
# was not built in place: the table itself.
TABLE = next((p for p in (os.path.join(_PACKAGE, "settings.def"),
                          os.path.join(os.path.dirname(_PACKAGE), "custom_ops", "common",
                                       "settings.def")) if os.path.exists(p)),
             os.path.join(_PACKAGE, "settings.def"))

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
