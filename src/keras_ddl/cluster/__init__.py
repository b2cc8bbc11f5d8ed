"""``python -m keras_ddl.cluster``: the command's name only. The test cluster
of network namespaces lives in ``keras_ddl_tools.cluster``, which the runtime
never imports; this package just runs it."""
