"""Optimizers for large-batch data-parallel training."""

from .lars import LARS

__all__ = ["LARS"]
