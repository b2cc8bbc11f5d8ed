"""Tools that ship with keras_ddl but are not part of its runtime: nothing in
``keras_ddl`` imports them except the ``python -m keras_ddl.bench model``
command, which loads ``scaling_model`` on demand, and the test cluster, which
shares ``rates`` (standard library only) with the scaling model."""
