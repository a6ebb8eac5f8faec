"""scalesgd: data-parallel training that is accurate at large minibatches and fast on slow networks."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`scalesgd.DistributedOptimizer` without importing torch.distributed for every CLI start."""
    if name == "DistributedOptimizer":
        from scalesgd.comm.engine import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module 'scalesgd' has no attribute {name!r}")
