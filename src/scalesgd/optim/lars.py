"""LARS (You et al. 2017): per-tensor trust ratios keep large-minibatch steps in proportion to each layer's weights."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch.optim import Optimizer

# Whole-group foreach passes stream every tensor from memory once per pass; over runs of about 1 MiB the
# buffer, weight and gradient stay in cache between the update's passes (resnet50 on CPU: ~1.4× → ~1.2× SGD).
CHUNK_BYTES = 1 << 20


class _TrustRatioSGD(Optimizer, ABC):
    """Arguments, their checks, the closure and the momentum state both LARS implementations share."""

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, eps: float = 1e-8, nesterov: bool = False):
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                    "trust_coefficient": trust_coefficient, "eps": eps, "nesterov": nesterov}
        _check(defaults)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """Check a group's own values too, before the group is kept."""
        _check({**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}})
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

    @abstractmethod
    def _step_group(self, group: dict) -> None:
        """Update the parameters of one group."""


class LARS(_TrustRatioSGD):
    """LARS with torch's momentum SGD, batched: a foreach norm call per group, foreach updates, no host sync.

    Groups with weight_decay > 0 scale g + wd·w by ρ = tc·‖w‖ / (‖g‖ + wd·‖w‖ + eps) (ρ = 1 when either
    norm is 0); groups with weight_decay == 0 (BN γ/β, biases) take plain momentum SGD steps.
    """

    def _step_group(self, group: dict) -> None:
        wd = group["weight_decay"]
        for params, grads in _batches(group["params"]):
            bufs = _momentum_buffers(self.state, params) if group["momentum"] else None
            if wd:
                ratios = trust_ratios(params, grads, wd, group["trust_coefficient"], group["eps"])
                factors = [list(f.unbind()) for f in (ratios, ratios * wd, -group["lr"] * ratios,
                                                      -group["lr"] * wd * ratios)]
            for part in _cache_chunks(params):
                part_bufs = None if bufs is None else bufs[part]
                if wd:
                    _lars_update(params[part], grads[part], part_bufs, [f[part] for f in factors], group)
                else:
                    _momentum_step(params[part], grads[part], part_bufs, group)


class NaiveLARS(_TrustRatioSGD):
    """LARS one tensor at a time with Python branching; kept only as the baseline of `scalesgd bench optimizer`."""

    def _step_group(self, group: dict) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            update = p.grad
            if wd:
                update = p.grad.add(p, alpha=wd)
                w_norm, g_norm = p.norm(), p.grad.norm()
                if w_norm > 0 and g_norm > 0:
                    update.mul_(group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm + group["eps"]))
            if momentum:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = update.clone()
                else:
                    buf.mul_(momentum).add_(update)
                update = update.add(buf, alpha=momentum) if group["nesterov"] else buf
            p.add_(update, alpha=-lr)


def _lars_update(params: list, grads: list, bufs: list | None, factors: list, group: dict) -> None:
    """w −= lr·update with g′ = ρ·g + ρ·wd·w, never built: each term goes into buf or w by addcmul, nothing allocated.

    `factors` are per-tensor lists of ρ, ρ·wd, −lr·ρ and −lr·ρ·wd.
    """
    rho, rho_wd, lr_rho, lr_rho_wd = factors
    lr, momentum = group["lr"], group["momentum"]
    if bufs is not None:
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_addcmul_(bufs, grads, rho)
        torch._foreach_addcmul_(bufs, params, rho_wd)
        if not group["nesterov"]:
            torch._foreach_add_(params, bufs, alpha=-lr)
            return
    torch._foreach_addcmul_(params, params, lr_rho_wd)  # w −= lr·g′ directly: without momentum, or nesterov's g′
    torch._foreach_addcmul_(params, grads, lr_rho)
    if bufs is not None:
        torch._foreach_add_(params, bufs, alpha=-lr * momentum)


def _momentum_step(params: list, grads: list, bufs: list | None, group: dict) -> None:
    """torch's SGD form, rate outside the buffer: buf = m·buf + g; w −= lr·(g + m·buf if nesterov else buf)."""
    lr, momentum = group["lr"], group["momentum"]
    if bufs is not None:
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads)
        if not group["nesterov"]:
            torch._foreach_add_(params, bufs, alpha=-lr)
            return
    torch._foreach_add_(params, grads, alpha=-lr)
    if bufs is not None:
        torch._foreach_add_(params, bufs, alpha=-lr * momentum)


def trust_ratios(params: list, grads: list, weight_decay: float, trust_coefficient: float,
                 eps: float) -> torch.Tensor:
    """ρ of every tensor as one vector, computed on the device so that no value crosses to the host."""
    w = torch.stack(torch._foreach_norm(params))
    g = torch.stack(torch._foreach_norm(grads))
    ratio = trust_coefficient * w / (g + weight_decay * w + eps)
    return torch.where((w > 0) & (g > 0), ratio, torch.ones_like(ratio))


def _batches(params: list):
    """Parameters with a gradient and their gradients, split by device and dtype as foreach ops need."""
    batches: dict = {}
    for p in params:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError("LARS does not support sparse gradients")
        ps, gs = batches.setdefault((p.device, p.dtype), ([], []))
        ps.append(p)
        gs.append(p.grad)
    return batches.values()


def _cache_chunks(params: list) -> list[slice]:
    """Runs of tensors of about CHUNK_BYTES: each foreach pass over a run finds the previous pass's data in cache."""
    parts, start, size = [], 0, 0
    for i, p in enumerate(params):
        if i > start and size + p.numel() * p.element_size() > CHUNK_BYTES:
            parts.append(slice(start, i))
            start, size = i, 0
        size += p.numel() * p.element_size()
    parts.append(slice(start, len(params)))
    return parts


def _momentum_buffers(state, params: list) -> list:
    """Each parameter's buffer; a new one starts at zero, so m·0 + g′ = g′ exactly, as torch's first-step clone."""
    bufs = []
    for p in params:
        buf = state[p].get("momentum_buffer")
        if buf is None:
            buf = state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        bufs.append(buf)
    return bufs


def _check(h: dict) -> None:
    """Reject arguments with no meaning, naming the value, before any step uses them."""
    if not h["lr"] >= 0:
        raise ValueError(f"invalid lr {h['lr']}: must be >= 0")
    if not 0 <= h["momentum"] < 1:
        raise ValueError(f"invalid momentum {h['momentum']}: must be in [0, 1)")
    if not h["weight_decay"] >= 0:
        raise ValueError(f"invalid weight_decay {h['weight_decay']}: must be >= 0")
    if not h["trust_coefficient"] > 0:
        raise ValueError(f"invalid trust_coefficient {h['trust_coefficient']}: must be > 0")
    if not h["eps"] >= 0:
        raise ValueError(f"invalid eps {h['eps']}: must be >= 0")
    if h["nesterov"] and not h["momentum"] > 0:
        raise ValueError(f"invalid nesterov=True with momentum {h['momentum']}: nesterov needs momentum > 0")
