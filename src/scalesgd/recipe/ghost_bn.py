"""BN statistics over groups of n samples ("ghost" batch norm), whatever the batch each worker holds.

Goyal et al. grow the minibatch by adding workers, each normalising over its own n samples, so BN
behaves the same at every kn. A study on fewer processes (e.g. `scalesgd sweep` on one machine) holds
more samples per worker; normalising each group of n separately keeps BN as k·n workers would have it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GhostBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics come from each group of `ghost_batch` consecutive samples.

    The running statistics move once per forward, towards the mean over groups of the groups' mean and
    unbiased variance (the average of what the k·n workers' BN layers would see). Evaluation, the
    parameters and the buffers are BatchNorm2d's, so checkpoints load into either.
    """

    ghost_batch: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.ghost_batch
        if not self.training or n <= 0 or x.shape[0] <= n:
            return super().forward(x)
        whole = x.shape[0] // n * n
        if whole < x.shape[0]:  # an epoch's short last batch: the rest is a group of its own
            rest = F.batch_norm(x[whole:], None, None, self.weight, self.bias, True, 0.0, self.eps)
            return torch.cat([self.forward(x[:whole]), rest])
        batch, channels = x.shape[:2]
        groups = batch // n
        # (G·n, C, H, W) → (n, G·C, H, W): one batch_norm call normalises each group's channels on their own
        grouped = x.reshape(groups, n, channels, *x.shape[2:]).transpose(0, 1).reshape(n, groups * channels,
                                                                                          *x.shape[2:])
        weight = self.weight.repeat(groups) if self.weight is not None else None
        bias = self.bias.repeat(groups) if self.bias is not None else None
        out = F.batch_norm(grouped, None, None, weight, bias, True, 0.0, self.eps)
        if self.track_running_stats:
            self._update_running_stats(grouped.detach(), groups, channels)
        return out.reshape(n, groups, channels, *x.shape[2:]).transpose(0, 1).reshape(x.shape)

    @torch.no_grad()
    def _update_running_stats(self, grouped: torch.Tensor, groups: int, channels: int) -> None:
        dims = [d for d in range(grouped.dim()) if d != 1]
        var, mean = torch.var_mean(grouped, dim=dims, correction=1)
        self.num_batches_tracked.add_(1)
        momentum = self.momentum if self.momentum is not None else 1.0 / self.num_batches_tracked.item()
        self.running_mean.lerp_(mean.view(groups, channels).mean(0), momentum)
        self.running_var.lerp_(var.view(groups, channels).mean(0), momentum)


def use_ghost_batch(model: nn.Module, n: int) -> nn.Module:
    """Make every BatchNorm2d of `model` normalise over groups of `n` samples in training (0: the whole batch).

    The layers keep their identity (blocks refer to them by more than one name), their parameters and
    their buffers; only their class changes.
    """
    if n <= 0:
        return model
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.__class__ = GhostBatchNorm2d
            module.ghost_batch = n
    return model
