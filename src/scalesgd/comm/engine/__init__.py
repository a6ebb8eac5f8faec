"""The exchange engines: scalesgd's own `DistributedOptimizer`, the DDP hook that runs the same codecs inside
PyTorch DDP, the sharded engine that runs them on FSDP2's reduce-scatter (`fsdp`, FSDP2's internals read in
`fsdp_units` alone), and the `GradientExchange` object a training loop talks to whichever engine it uses
(`exchange.build_exchange`, by name: ddp, scalesgd, scalesgd-fsdp, fsdp2)."""
