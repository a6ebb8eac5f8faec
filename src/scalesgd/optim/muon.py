"""Muon for the hidden weight matrices and AdamW for every other parameter, as one torch optimizer (Jordan et al.
2024, "Muon: An optimizer for hidden layers in neural networks"; Thérien et al. 2025, "MuLoCo: Muon is a practical
inner optimizer for DiLoCo", its inner optimizer): torch's own `Muon` and `AdamW`, each on its part of the groups,
sharing one list of group dicts and one state, so that schedulers, checkpoints and `optimizer.state[p]` see one
optimizer."""

from __future__ import annotations

import torch

MUON = "muon"  # a group's key: True where its 2-D parameters are hidden weight matrices, Muon's to step


class MuonAdamW(torch.optim.Optimizer):
    """torch's Muon on the 2-D parameters of the groups marked `MUON`, torch's AdamW on all the others.

    Each given group becomes a Muon group (its matrices) and an AdamW group (the rest), with the same options;
    `param_groups` is Muon's groups, then AdamW's (the same dicts), and `state` is both optimizers' one state.
    Muon's update RMS is matched to AdamW's (`adjust_lr_fn` "match_rms_adamw", Liu et al. 2025), so both parts
    take the same rate and decay."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 adjust_lr_fn: str = "match_rms_adamw") -> None:
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        parts: tuple[list, list] = ([], [])  # (Muon's groups, AdamW's)
        for group in groups:
            options = {k: v for k, v in group.items() if k not in ("params", MUON)}
            tensors = list(group["params"])
            matrix = [bool(group.get(MUON)) and p.ndim == 2 for p in tensors]
            for part, mine in zip(parts, (True, False)):
                chosen = [p for p, m in zip(tensors, matrix) if m == mine]
                if chosen:
                    part.append({**options, "params": chosen})
        inner = []
        if parts[0]:
            inner.append(torch.optim.Muon(parts[0], lr=lr, weight_decay=weight_decay, momentum=momentum,
                                          nesterov=nesterov, adjust_lr_fn=adjust_lr_fn))
        if parts[1]:
            inner.append(torch.optim.AdamW(parts[1], lr=lr, betas=betas, weight_decay=weight_decay))
        self.inner = inner
        super().__init__([g for o in inner for g in o.param_groups], {"lr": lr, "weight_decay": weight_decay})
        self._share()

    def _share(self) -> None:
        """Point each inner optimizer at its own groups among ours (the same dicts) and at our one state."""
        at = 0
        for o in self.inner:
            n = len(o.param_groups)
            o.__setstate__({"state": self.state, "param_groups": self.param_groups[at:at + n]})
            at += n

    def __getstate__(self) -> dict:
        """The inner optimizers too, so a copy or a pickle steps as this one does."""
        return {**super().__getstate__(), "inner": self.inner}

    def __setstate__(self, state: dict) -> None:
        """After `load_state_dict` (new group dicts, a new state) or unpickling, the inner optimizers follow."""
        super().__setstate__(state)
        if "inner" in self.__dict__:
            self._share()

    @torch.no_grad()
    def step(self, closure=None):
        """Muon's step on the matrices, then AdamW's on the rest."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.inner:
            o.step()
        return loss
