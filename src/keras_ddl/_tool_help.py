"""``python -m keras_ddl.bench ... --help`` (and ``keras_ddl.cluster``) answer
at once, without importing TensorFlow and its start-up logs.

``python -m keras_ddl.X`` runs keras_ddl/__init__.py first, and that imports
TensorFlow (the Keras-serializable classes must register when keras_ddl is
imported). A user asking a tool for its options needs none of it: this
module, called at the top of keras_ddl/__init__.py, recognises a help request
to one of these tools from the interpreter's own command line
(``sys.orig_argv``), builds that tool's argparse parser (their modules import
no TensorFlow) and lets it print the help and exit. Anything else returns
and the package loads as usual.
"""

import importlib
import sys

# Module run with -m -> its function returning the argparse parser, or
# parsing argv (either prints the help and exits on -h/--help).
TOOLS = {
    "keras_ddl.bench": ("keras_ddl_tools.bench.__main__", "parse"),
    "keras_ddl.cluster": ("keras_ddl_tools.cluster.__main__", "build_parser"),
}
HELP_FLAGS = ("-h", "--help")
# The interpreter's options whose value is the next word.
OPTIONS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")


def requested_tool(orig_argv):
    """(tool module, its arguments) if ``orig_argv`` is ``python [options] -m
    TOOL ... -h|--help ...`` for a tool in TOOLS, else None."""
    i = 1
    while i < len(orig_argv):
        arg = orig_argv[i]
        if arg in OPTIONS_WITH_VALUE:
            i += 2  # -X importtime, -W error: the value is not a script
            continue
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
            module = orig_argv[i + 1] if arg == "-m" else arg[2:]
            args = orig_argv[i + 2:] if arg == "-m" else orig_argv[i + 1:]
            if module in TOOLS and any(a in HELP_FLAGS for a in args):
                return module, list(args)
            return None
        if not arg.startswith("-") or arg.startswith("-c"):
            return None  # a script or -c: not a tool run with -m
        i += 1
    return None


def answer_help_without_tensorflow():
    """Prints a tool's help and exits if that is all that was asked."""
    request = requested_tool(list(getattr(sys, "orig_argv", ())))
    if request is None:
        return
    module, args = request
    module_name, function = TOOLS[module]
    made = getattr(importlib.import_module(module_name), function)
    if function == "build_parser":
        made().parse_args(args)
    else:
        made(args)
    # A parser that did not exit (the help flag was an option's value): go on
    # loading keras_ddl, and the tool runs as usual.
