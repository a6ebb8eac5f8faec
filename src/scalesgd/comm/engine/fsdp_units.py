"""FSDP2's internals, read here alone: each sharded module ("unit") with its parameters as the sharded engine sums
them (a torch upgrade that moves them breaks this one file). Built once per unit, when the engine is."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # the documented `set_custom_reduce_scatter`'s

__all__ = ["ReduceScatter", "Unit", "UnitParam", "units_of"]


@dataclass(frozen=True)
class UnitParam:
    """One parameter of a unit: its whole size, and this rank's shard of it, padded as FSDP pads dim 0 to a multiple
    of the ranks sharing it (`padded`: the shard's size)."""

    param: object  # FSDP2's FSDPParam
    key: int  # its place among the model's parameters (the same in every run, whatever the world size)

    @property
    def whole(self) -> torch.Size:
        return self.param._orig_size

    @property
    def padded(self) -> torch.Size:
        return self.param.padded_sharded_param_size

    @property
    def rows(self) -> int:
        """Rows of dim 0 in a rank's padded shard."""
        return self.padded[0]

    def shard(self) -> torch.Tensor:
        """This rank's padded shard (its storage: written in place)."""
        return self.param._sharded_param_data.view(self.padded)

    def gathered(self) -> torch.Tensor:
        """The whole parameter as FSDP gathered it for compute."""
        return self.param.unsharded_param.detach()


@dataclass(frozen=True)
class Unit:
    """A module FSDP2 shards as one (one all-gather, one reduce-scatter), its number among the model's units and its
    own parameters (none for a module that only groups others)."""

    index: int
    module: FSDPModule
    params: tuple[UnitParam, ...]

    @property
    def keys(self) -> tuple[int, ...]:
        return tuple(p.key for p in self.params)

    def sum_with(self, reduce_scatter: ReduceScatter) -> None:
        """Its gradients' reduce-scatter runs `reduce_scatter` (FSDP calls it with its own buffers)."""
        self.module.set_custom_reduce_scatter(reduce_scatter)

    def across_nodes_with(self, hook) -> None:
        """After the node's reduce-scatter, `hook(shard)` sums its gradient shard across nodes, in place."""
        self.module.set_all_reduce_hook(hook)

    def keep_gathered_through_backward(self) -> None:
        """Its gathered weights stay until the step (a codec reads them at its sum)."""
        self.module.set_reshard_after_backward(False)


def units_of(model: nn.Module) -> list[Unit]:
    """Every module FSDP2 shards in `model`, in `model.modules()` order (the root first)."""
    numbers = {id(p): i for i, p in enumerate(model.parameters())}
    units = []
    for index, module in enumerate(m for m in model.modules() if isinstance(m, FSDPModule)):
        params = [p for group in _param_groups(module) for p in group.fsdp_params]
        units.append(Unit(index, module, tuple(UnitParam(p, numbers[id(p.sharded_param)]) for p in params)))
    return units


def _param_groups(module: FSDPModule) -> list:
    """A unit's parameter groups: a list since torch 2.12, one group (or None) before."""
    state = module._get_fsdp_state()
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    return [state._fsdp_param_group] if state._fsdp_param_group is not None else []
