"""Parameter groups: weight decay only where it is a regulariser (Goyal et al. Remark 1)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from scalesgd.optim import (ADAPTIVE, MUON, OPTIMIZERS, EarlyFreezeWarning, MomentumCorrectedSGD, OneBitAdam,
                            OptimizerSettings)

_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


def param_groups(model: nn.Module, weight_decay: float, bias_decay: bool = True,
                 embedding_decay: bool = True, muon: bool = False) -> list[dict]:
    """Split parameters into a decayed group and a group with no decay.

    The learnable γ/β of normalisation layers are never decayed; biases are decayed unless
    `bias_decay` is False, embeddings (and an output layer tied to one) unless `embedding_decay` is False.
    Order inside each group follows `model.parameters()`, so every rank builds identical groups.
    `muon`: the decayed group is marked as the hidden weights (`MUON`: Muon's where 2-D), and the output head's
    weight (the model's last `nn.Linear`'s) and any decayed embedding move to a third decayed group, AdamW's.
    """
    no_decay_ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, _NORM_TYPES):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
        elif isinstance(module, nn.Embedding) and not embedding_decay:
            no_decay_ids.add(id(module.weight))
        elif not bias_decay and getattr(module, "bias", None) is not None:
            no_decay_ids.add(id(module.bias))
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if id(p) in no_decay_ids else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if muon:
        apart = _head_and_embeddings(model)
        groups[0] = {**groups[0], "params": [p for p in decay if id(p) not in apart], MUON: True}
        head = [p for p in decay if id(p) in apart]
        if head:
            groups.append({"params": head, "weight_decay": weight_decay})
    return groups


def _head_and_embeddings(model: nn.Module) -> set[int]:
    """The ids of the output head's weight (the last `nn.Linear`'s) and of every embedding's: matrices that are not
    hidden layers, which Muon leaves to AdamW."""
    ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if linears:
        ids.add(id(linears[-1].weight))
    return ids


def build_sgd(model: nn.Module, lr: float, momentum: float, nesterov: bool, weight_decay: float,
              bias_decay: bool = True) -> torch.optim.SGD:
    """torch's SGD (the u-form u ← m·u + g, w ← w − η·u: no momentum correction needed)."""
    return build_optimizer(model, "sgd", lr, momentum, nesterov, weight_decay, bias_decay)


def build_optimizer(model: nn.Module, kind: str, lr: float, momentum: float, nesterov: bool, weight_decay: float,
                    bias_decay: bool = True, trust_coefficient: float = 0.001,
                    momentum_in_exchange: bool = False, betas: tuple[float, float] = (0.9, 0.999),
                    freeze_step: int = 0, freeze_variance: bool = False) -> torch.optim.Optimizer:
    """A registered optimizer on the recipe's groups (LARS leaves the no-decay group, BN γ/β, alone; Adam's kinds
    decay no bias, norm or embedding, as is usual for transformers; muon's groups mark the hidden matrices).

    `momentum_in_exchange`: the exchange applies the gradient's momentum (DGC's momentum correction), so
    SGD keeps momentum for the weight decay only (`MomentumCorrectedSGD`), and AdamW steps with the momentum that
    arrives, its variance frozen after `freeze_step` (`OneBitAdam`)."""
    adaptive = kind in ADAPTIVE and kind != "lamb"  # lamb keeps the recipe's groups it was measured with
    groups = param_groups(model, weight_decay, bias_decay and not adaptive, embedding_decay=not adaptive,
                          muon=kind == "muon")
    with warnings.catch_warnings():  # `scalesgd train` warns of an early freeze once, at start (`rules.advice`)
        warnings.simplefilter("ignore", EarlyFreezeWarning)
        return _build(groups, kind, lr, momentum, nesterov, trust_coefficient, momentum_in_exchange, betas,
                      freeze_step, freeze_variance)


def _build(groups: list[dict], kind: str, lr: float, momentum: float, nesterov: bool, trust_coefficient: float,
           momentum_in_exchange: bool, betas: tuple[float, float], freeze_step: int,
           freeze_variance: bool) -> torch.optim.Optimizer:
    """The optimizer on its groups: the exchange's momentum kind where it carries the momentum, else the registered."""
    if momentum_in_exchange:
        if kind == "adamw":  # the exchange carries Adam's momentum: Adam steps with it, its variance frozen
            return OneBitAdam(groups, lr=lr, betas=tuple(betas), freeze_step=freeze_step)
        if kind != "sgd":
            raise ValueError(f"momentum in the exchange needs the sgd or adamw optimizer, got {kind!r}")
        return MomentumCorrectedSGD(groups, lr, momentum, nesterov=nesterov)
    return OPTIMIZERS[kind].build(groups, OptimizerSettings(lr, momentum, nesterov, trust_coefficient, tuple(betas),
                                                            freeze_step, freeze_variance))
