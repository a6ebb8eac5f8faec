"""The exchange engines: scalesgd's own `DistributedOptimizer`, the DDP hook that runs the same codecs inside
PyTorch DDP, and the `GradientExchange` object a training loop talks to whichever engine it uses."""
