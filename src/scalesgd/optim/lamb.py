"""LAMB (You et al. 2020): Adam's direction with LARS's per-tensor trust ratio ‖w‖/‖u‖."""

from __future__ import annotations

import math

import torch

from scalesgd.optim._batched import BatchedOptimizer, batches, cache_chunks, check_adam, local, whole_norms

# Runs of about 1 MiB of parameters, as LARS's (lars.CHUNK_BYTES): after the Adam kernel's pass over a run, the
# decay term, both norms and the update find its w and u in cache; u's buffer is one run (or one tensor) long.
CHUNK_BYTES = 1 << 20


class LAMB(BatchedOptimizer):
    """LAMB, batched: torch's fused Adam kernel for the moments, foreach norms and updates, no host sync.

    m, v as Adam's, m̂ = m/(1−β1^t), v̂ = v/(1−β2^t) with `bias_correction` (else m̂ = m, v̂ = v);
    u = m̂/(√v̂ + eps) + wd·w; w ← w − lr·(‖w‖/‖u‖)·u, the ratio 1 when either norm is 0. Groups with
    weight_decay == 0 (BN γ/β, biases) take plain Adam steps, w ← w − lr·m̂/(√v̂ + eps), as timm's LAMB.
    The state is torch's Adam's: `step` (t of each parameter), `exp_avg` (m) and `exp_avg_sq` (v).

    The moments and m̂/(√v̂ + eps) come from `torch._fused_adam_`, one pass over g, m and v (dense
    parameters, as torch's `Adam(fused=True)` needs), written into a scratch buffer u kept between steps: the
    same update in foreach ops alone (sqrt, division, a fresh u) measured 2.4× torch SGD's step on resnet50's
    parameters, against 1.4× with the kernel.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, bias_correction: bool = True):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "bias_correction": bias_correction})
        self._scratch: dict = {}  # (device, dtype) → flat buffer for u; not state, never saved

    def __setstate__(self, state: dict) -> None:
        """Unpickled or deep-copied (torch pickles defaults, state and groups only): a scratch of its own."""
        super().__setstate__(state)
        self._scratch = {}

    @staticmethod
    def _check(h: dict) -> None:
        check_adam(h)

    def _step_group(self, group: dict) -> None:
        wd, lr = group["weight_decay"], group["lr"]
        beta1, beta2 = group["betas"]
        adam = {"beta1": beta1, "beta2": beta2, "weight_decay": 0.0, "eps": group["eps"], "amsgrad": False,
                "maximize": False}
        for params, grads in batches(group["params"], "LAMB"):
            m, v, steps = self._state(params)
            chunks = cache_chunks(params, CHUNK_BYTES)  # by whole sizes: the same runs on every rank of a sharded model
            first = params[0]
            params, grads, m, v = local(params), local(grads), local(m), local(v)
            torch._foreach_add_(steps, 1)
            # the kernel corrects by 1 − β^t; at t = ∞ that is 1, no correction
            t = steps if group["bias_correction"] else [self._never(params[0].device)] * len(steps)
            if not wd:
                torch._fused_adam_(params, grads, m, v, [], t, lr=lr, **adam)
                continue
            for part in chunks:
                w, u = params[part], self._buffers(params[part])
                torch._foreach_zero_(u)
                # Adam's step w − lr·m̂/(√v̂ + eps) taken from u = 0 with lr = −1 leaves u = m̂/(√v̂ + eps)
                torch._fused_adam_(u, grads[part], m[part], v[part], [], t[part], lr=-1.0, **adam)
                torch._foreach_add_(u, w, alpha=wd)
                w_norm, u_norm = whole_norms(w, u, sharded_as=first)
                ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                torch._foreach_addcmul_(w, u, list((-lr * ratio).unbind()))

    def _state(self, params: list) -> tuple[list, list, list]:
        """m, v and t of each parameter, new ones at zero; t a float32 on the parameter's device, as the kernel
        reads it there (no host reads)."""
        m, v, steps = [], [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if state["exp_avg"].stride() != p.stride():  # preserve_format keeps the strides of dense tensors only
                    raise ValueError(f"LAMB needs dense parameters (strides {p.stride()} for shape {tuple(p.shape)})")
            elif state["step"].device != p.device or state["step"].dtype != torch.float32:
                state["step"] = state["step"].to(p.device, torch.float32)  # as saved, or torch Adam's float64
            m.append(state["exp_avg"])
            v.append(state["exp_avg_sq"])
            steps.append(state["step"])
        return m, v, steps

    def _buffers(self, params: list) -> list:
        """u for each parameter: views, laid out as the parameter (the kernel reads memory flat), of one buffer."""
        sizes = [p.numel() for p in params]
        key = (params[0].device, params[0].dtype)
        flat = self._scratch.get(key)
        if flat is None or flat.numel() < sum(sizes):
            flat = self._scratch[key] = torch.empty(sum(sizes), dtype=key[1], device=key[0])
        return [part.as_strided(p.shape, p.stride()) for p, part in zip(params, flat[:sum(sizes)].split(sizes))]

    def _never(self, device: torch.device) -> torch.Tensor:
        """A step count of ∞ on `device`, for groups without bias correction."""
        key = (device, "inf")
        if key not in self._scratch:
            self._scratch[key] = torch.full((), math.inf, dtype=torch.float32, device=device)
        return self._scratch[key]
