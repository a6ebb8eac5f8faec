"""Loss normalisation by the global minibatch (Goyal et al. Remark 3)."""

import torch


def global_batch_loss(loss_sum: torch.Tensor, world_size: int, global_count: int) -> torch.Tensor:
    """The per-worker loss whose gradient, averaged over `world_size` workers, is the global-batch mean.

    `loss_sum` is this worker's summed (not averaged) loss and `global_count` the number of samples in
    the whole step across workers, so workers holding different numbers of samples are weighted by
    their true counts; with equal counts n this is the usual per-worker mean.
    """
    return loss_sum * (world_size / global_count)
