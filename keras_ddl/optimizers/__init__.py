"""Optimizers for large-batch data-parallel training."""

from keras_ddl.optimizers.lars import LARS

__all__ = ["LARS"]
