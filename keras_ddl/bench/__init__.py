"""Benchmarks that print tables (see BENCHMARKS.md): ``python -m keras_ddl.bench``."""
