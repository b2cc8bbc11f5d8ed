"""Fills the public module paths (keras_ddl.callbacks, .data, .schedules,
.optimizers, .optimizers.lars, .ops) with their layer module's names."""


def re_export(namespace, layer):
    """Copies every name of ``layer`` into ``namespace`` (a module's
    globals), private names and ``__all__`` included: each of these paths
    was the layer module itself before it became a module of its own, so
    scripts may use any of its names. Names the module already has (its own
    submodules, its docstring) stay."""
    for name, value in vars(layer).items():
        if name == "__doc__":
            namespace["__doc__"] = namespace.get("__doc__") or value
        elif not name.startswith("__") or name == "__all__":
            namespace.setdefault(name, value)
