"""Tools that ship with keras_ddl but are not part of its runtime: the
benchmarks (``bench``), the test cluster of network namespaces
(``cluster``), results files and the docs' tables rendered from them
(``results``, ``render_docs``), and the scaling model (``scaling_model``).
Nothing in the ``keras_ddl`` runtime imports them; the commands
``python -m keras_ddl.bench`` and ``python -m keras_ddl.cluster`` run them
under their documented names."""
