"""What every rank of a run builds before it trains, alike on each (`--seed` fixes the weights): the data and the
model, initialised as its recipe says."""

from __future__ import annotations

import torch
from torch import nn

from scalesgd.config import TrainConfig
from scalesgd.data import DataBundle, FolderData, load_bundle
from scalesgd.models import build_model
from scalesgd.recipe import initialize, use_ghost_batch


def data_and_model(cfg: TrainConfig) -> tuple[DataBundle | FolderData, nn.Module]:
    """The data and the model as every rank builds them (`seed` fixes the weights)."""
    torch.manual_seed(cfg.recipe.seed)
    data = load_bundle(cfg.data.dataset, **vars(cfg.data_request()))
    model = build_model(cfg.model.name, data.num_classes, data.in_channels, cfg.model.options)
    if not data.is_text:  # Goyal et al.'s initialisation is a CNN's; the GPT initialises itself as GPT-2 does
        initialize(model, cfg.recipe.zero_gamma, cfg.recipe.bn_momentum)
    use_ghost_batch(model, cfg.recipe.bn_batch)
    return data, model
