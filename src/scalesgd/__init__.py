"""scalesgd: data-parallel training that is accurate at large minibatches and fast on slow networks."""

__version__ = "0.1.0"
