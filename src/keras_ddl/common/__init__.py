"""The process model and its settings, without TensorFlow: ``init``,
``rank``/``size`` and the rest of who-is-who (``basics``, over the core's C
API in ``libddl_core.so``), process sets, GPU pinning, the ``HOROVOD_*``
environment names, and the checks of rank arguments (``validation``).
The ``DDL_*`` settings table itself is ``custom_ops/common/settings.def``,
which the core compiles and the build copies beside the libraries for
ddlrun.
"""
