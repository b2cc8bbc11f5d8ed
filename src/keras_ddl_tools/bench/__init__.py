"""Benchmarks that print tables: ``python -m keras_ddl.bench`` (docs/PERFORMANCE.md)."""
