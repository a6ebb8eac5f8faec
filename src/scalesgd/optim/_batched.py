"""What the batched optimizers (LARS, LAMB) share: argument checks, the closure, foreach batches, cache-sized runs."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer


class BatchedOptimizer(Optimizer, ABC):
    """Checks every group's values before it is kept, runs the closure and steps group by group."""

    def __init__(self, params, defaults: dict):
        self._check(defaults)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """Check a group's own values too, before the group is kept."""
        self._check({**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}})
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns the closure's loss, as torch optimizers do."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    @staticmethod
    @abstractmethod
    def _check(h: dict) -> None:
        """Reject arguments with no meaning, naming the value (ValueError), before any step uses them."""

    @abstractmethod
    def _step_group(self, group: dict) -> None:
        """Update the parameters of one group."""


def require(ok: bool, name: str, value, rule: str) -> None:
    """ValueError naming the argument and its value unless `ok` (written so that NaN fails: `not x >= 0`)."""
    if not ok:
        raise ValueError(f"invalid {name} {value}: {rule}")


def check_lr_and_decay(h: dict) -> None:
    require(h["lr"] >= 0, "lr", h["lr"], "must be >= 0")
    require(h["weight_decay"] >= 0, "weight_decay", h["weight_decay"], "must be >= 0")


def check_fraction(name: str, value) -> None:
    """A momentum-like coefficient: in [0, 1)."""
    require(0 <= value < 1, name, value, "must be in [0, 1)")


def check_adam(h: dict) -> None:
    """Adam's hyper-parameters: the rate and decay, a pair of betas in [0, 1), a positive ε."""
    check_lr_and_decay(h)
    betas = h["betas"]
    require(isinstance(betas, (tuple, list)) and len(betas) == 2, "betas", betas, "must be a pair (β1, β2)")
    check_fraction("beta1", betas[0])
    check_fraction("beta2", betas[1])
    require(h["eps"] > 0, "eps", h["eps"], "must be > 0")


def batches(params: list, optimizer: str):
    """Parameters with a gradient and their gradients, split by device and dtype as foreach ops need."""
    found: dict = {}
    for p in params:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError(f"{optimizer} does not support sparse gradients")
        ps, gs = found.setdefault((p.device, p.dtype), ([], []))
        ps.append(p)
        gs.append(p.grad)
    return found.values()


def cache_chunks(params: list, budget: int) -> list[slice]:
    """Runs of tensors of about `budget` bytes: each foreach pass over a run finds the previous pass's data in cache."""
    parts, start, size = [], 0, 0
    for i, p in enumerate(params):
        if i > start and size + p.numel() * p.element_size() > budget:
            parts.append(slice(start, i))
            start, size = i, 0
        size += p.numel() * p.element_size()
    parts.append(slice(start, len(params)))
    return parts


def local(tensors: list) -> list:
    """Each tensor's own part, which foreach ops take: a sharded tensor's (FSDP2's DTensor) shard, else itself."""
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def whole_norms(*lists: list, sharded_as=None) -> list[torch.Tensor]:
    """Each tensor's whole norm, a vector per list: where the parameters are sharded (`sharded_as` one of them, an
    FSDP2 DTensor), from the shards' partial squares summed over its mesh in one allreduce for every list (the
    layer-wise ratios need the layer's norm, not a shard's)."""
    norms = [torch.stack(torch._foreach_norm(local(tensors))) for tensors in lists]
    if not isinstance(sharded_as, DTensor):
        return norms
    squares = torch.cat(norms).square()
    mesh = sharded_as.device_mesh  # sharded over its last dim (FSDP2's hybrid mesh replicates over the first)
    dist.all_reduce(squares, group=mesh.get_group(mesh.ndim - 1))
    return list(squares.sqrt().split([len(tensors) for tensors in lists]))
