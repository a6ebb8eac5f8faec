"""SGD for gradients that already carry their momentum: DGC's momentum correction moves the gradient's
momentum into the exchange (where momentum factor masking can act on it), so here momentum applies only
to the weight-decay term. By linearity this is torch's SGD (u ← m·u + g + λw, w ← w − η·u) when nothing
is masked."""

from __future__ import annotations

import torch


class MomentumCorrectedSGD(torch.optim.Optimizer):
    """w ← w − lr·(g + d), d the weight decay λw with its own momentum buffer (nesterov: λw + m·buffer)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"lr {lr}, momentum {momentum} and weight_decay {weight_decay} must be >= 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "nesterov": nesterov})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            decay, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if decay:
                    d = p.mul(decay)
                    if momentum:
                        state = self.state[p]
                        if "decay_momentum" not in state:
                            state["decay_momentum"] = d.clone()
                        else:
                            state["decay_momentum"].mul_(momentum).add_(d)
                        buffer = state["decay_momentum"]
                        d = d.add(buffer, alpha=momentum) if group["nesterov"] else buffer
                    update = update.add(d)
                p.add_(update, alpha=-group["lr"])
        return loss
