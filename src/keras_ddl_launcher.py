"""Entry point of the ``ddlrun`` command, kept outside the keras_ddl package.

``import keras_ddl`` imports TensorFlow (the Keras-serializable classes must
register at import), which takes seconds and which the launcher never needs.
Here keras_ddl.runner is imported without running keras_ddl/__init__.py: the
package is located with ``importlib.util.find_spec`` (which does not execute
it) and a bare module with its ``__path__`` stands in for it in this
process. The process then only ever runs the launcher; the ranks it starts
import keras_ddl as usual.
"""

import importlib
import importlib.util
import sys
import types


def load_runner(module="ddlrun"):
    """keras_ddl.runner.<module>, without TensorFlow unless keras_ddl was
    already imported in this process."""
    if "keras_ddl" not in sys.modules:
        spec = importlib.util.find_spec("keras_ddl")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("ddlrun: the keras_ddl package is not installed in "
                             f"{sys.executable}'s environment")
        package = types.ModuleType("keras_ddl", "keras_ddl, launcher only (no TensorFlow API)")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__file__ = spec.origin
        package.__package__ = "keras_ddl"
        sys.modules["keras_ddl"] = package
    return importlib.import_module("keras_ddl.runner." + module)


def main():
    return load_runner().main()


if __name__ == "__main__":
    sys.exit(main())
