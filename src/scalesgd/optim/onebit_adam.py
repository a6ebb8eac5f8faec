"""1-bit Adam's update (Tang, Gan, Rajbhandari, Lian, Zhang, Liu and He 2021, "1-bit Adam: Communication Efficient
Large-Scale Training with Adam's Convergence Speed"): Adam's variance settles early in training, so after a
warm-up it is frozen, and Adam becomes momentum SGD with a fixed per-coordinate rate, whose momentum can travel
compressed with error feedback (`scalesgd.comm.codecs.onebit`).

Steps 1 … `freeze_step` of a parameter are torch's AdamW on the mean gradient, bit for bit (its own functional
`adam`, decoupled weight decay, bias correction). After them the incoming `.grad` IS the momentum m̄ the onebit
codec averaged: exp_avg ← m̄, exp_avg_sq stays at its step-`freeze_step` value v_N, and

    p ← p − lr·wd·p − lr · (m̄ / (1 − β1^t)) / (√(v_N / (1 − β2^N)) + eps)

with t the parameter's step and N = `freeze_step`. The paper drops the bias correction of m after the freeze; we
keep Adam's, so that with an exact exchange this is AdamW with its variance frozen and the step does not jump by
1/(1 − β1^N) at the freeze (past the paper's warm-ups of thousands of steps the factor is 1 anyway).

The optimizer's β1 must equal the codec's (`--onebit-beta1`), and the codec's dense warm-up (`compress_after`)
must end where `freeze_step` does: at the freeze the codec's momentum then equals this exp_avg. The state is
torch's Adam's (`step`, `exp_avg`, `exp_avg_sq`), saved and loaded by torch's optimizer state_dict.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch.optim.adam import adam

from scalesgd.optim._batched import BatchedOptimizer, batches, check_adam, local, require


class EarlyFreezeWarning(UserWarning):
    """Adam's variance frozen before its running mean has covered its averaging horizon."""


def variance_horizon(beta2: float) -> int:
    """Adam's averaging horizon 1/(1 − β2) in steps: the variance is a mean over about that many gradients, so it is
    Adam's own only after them (0/1 Adam, Lu et al. 2022, lets it settle before it is held)."""
    return math.ceil(round(1 / (1 - beta2), 6))


def early_freeze(freeze_step: int, beta2: float) -> str | None:
    """Why freezing Adam's variance after `freeze_step` steps is too early for this β2, or None."""
    horizon = variance_horizon(beta2)
    if freeze_step >= horizon:
        return None
    return (f"Adam's variance frozen after {freeze_step} steps, before its averaging horizon 1/(1 − β2) = {horizon} "
            f"steps (β2 {beta2:g}): it is not yet Adam's variance and the steps after the freeze are mis-scaled "
            f"(β2 0.99 frozen at 20 measured +17 % validation loss for 1-bit Adam, +45 % for top-k carrying Adam's "
            f"momentum: docs/results.md#adam-freeze); freeze at {horizon} or later")


class OneBitAdam(BatchedOptimizer):
    """AdamW for each parameter's first `freeze_step` steps, then its variance frozen and `.grad` taken as the
    averaged momentum (see the module). `freeze_step` None: Adam's averaging horizon 1/(1 − β2); an earlier one
    warns (`EarlyFreezeWarning`)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, freeze_step: int | None = None, grad_is_momentum: bool = True):
        beta2 = betas[1] if isinstance(betas, (tuple, list)) and len(betas) == 2 else None
        if isinstance(beta2, (int, float)) and 0 <= beta2 < 1:  # else `_check` names the bad betas
            if freeze_step is None:
                freeze_step = variance_horizon(beta2)
            elif isinstance(freeze_step, int) and freeze_step >= 1:
                problem = early_freeze(freeze_step, beta2)
                if problem:
                    warnings.warn(problem, EarlyFreezeWarning, stacklevel=2)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "freeze_step": freeze_step, "grad_is_momentum": grad_is_momentum})

    @property
    def freeze_step(self) -> int:
        """Where the first group's variance freezes: the dense start of a codec carrying its momentum."""
        return self.param_groups[0]["freeze_step"]

    @staticmethod
    def _check(h: dict) -> None:
        check_adam(h)
        n = h["freeze_step"]
        require(isinstance(n, int) and not isinstance(n, bool) and n >= 1, "freeze_step", n,
                "must be a whole number >= 1 (the variance needs a warm-up to freeze)")

    def _step_group(self, group: dict) -> None:
        lr, wd, eps, n = group["lr"], group["weight_decay"], group["eps"], group["freeze_step"]
        beta1, beta2 = group["betas"]
        for params, grads in batches(group["params"], "OneBitAdam"):
            states = [self._state(p) for p in params]
            warm = [i for i, s in enumerate(states) if s["step"].item() < n]
            frozen = [i for i, s in enumerate(states) if s["step"].item() >= n]
            if warm:
                adam([params[i] for i in warm], [grads[i] for i in warm], [states[i]["exp_avg"] for i in warm],
                     [states[i]["exp_avg_sq"] for i in warm], [], [states[i]["step"] for i in warm],
                     has_complex=any(torch.is_complex(params[i]) for i in warm), decoupled_weight_decay=True,
                     amsgrad=False, beta1=beta1, beta2=beta2, lr=lr, weight_decay=wd, eps=eps, maximize=False)
            if frozen:
                self._frozen_step([params[i] for i in frozen], [grads[i] for i in frozen],
                                  [states[i] for i in frozen], lr, wd, eps, beta1, beta2 ** n,
                                  group.get("grad_is_momentum", True))

    @staticmethod
    def _frozen_step(params: list, grads: list, states: list[dict], lr: float, wd: float, eps: float,
                     beta1: float, beta2_n: float, grad_is_momentum: bool = True) -> None:
        """exp_avg ← grad (the averaged momentum), or Adam's m ← β1·m + (1 − β1)·grad where the grad is a gradient
        (a sparse codec's); decoupled decay, the step with the frozen v̂."""
        m, v = local([s["exp_avg"] for s in states]), local([s["exp_avg_sq"] for s in states])
        params, grads = local(params), local(grads)  # a sharded model's (FSDP2's) shards: foreach ops take them
        torch._foreach_add_([s["step"] for s in states], 1)
        if grad_is_momentum:
            torch._foreach_copy_(m, grads)
        else:
            torch._foreach_lerp_(m, grads, 1 - beta1)
        if wd:
            torch._foreach_mul_(params, 1 - lr * wd)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, (1 - beta2_n) ** 0.5)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, m, denom, [-lr / (1 - beta1 ** s["step"].item()) for s in states])

    def _state(self, p: torch.Tensor) -> dict:
        """The parameter's state, new as torch's AdamW makes it (step a host scalar, moments zero)."""
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64
                                         else torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state
