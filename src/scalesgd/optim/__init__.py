"""Optimizers beyond torch's own: LARS for very large minibatches."""

from scalesgd.optim.lars import LARS, NaiveLARS

__all__ = ["LARS", "NaiveLARS"]
