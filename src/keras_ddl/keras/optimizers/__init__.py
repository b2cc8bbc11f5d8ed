"""Optimizers for large-batch data-parallel training: ``LARS`` (layer-wise
adaptive rate scaling, You et al. 2017), a Keras 3 optimizer. Users import
it as ``keras_ddl.optimizers.LARS``."""

from .lars import LARS

__all__ = ["LARS"]
