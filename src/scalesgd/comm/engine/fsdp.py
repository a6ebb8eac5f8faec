"""The sharded engine: PyTorch's FSDP2 (`fully_shard`) keeps each rank's shard of the parameters, their gradients and
the optimizer's state, and the gradients' reduce-scatter travels on the codec's wire.

    model = shard_model(model, units=model.blocks, precision="bf16")   # before the optimizer: it needs the shards
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    exchange = build_exchange("scalesgd-fsdp", model, optimizer, ExchangeSetup(codec="bf16"))
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from scalesgd.comm.codecs import CODECS, make_codec
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.codecs.registry import CROSS_NODE_SHARDS
from scalesgd.comm.engine.base import ExchangeSetup, GradientExchange
from scalesgd.comm.engine.driver import BucketDriver, open_channel
from scalesgd.comm.engine.fsdp_sums import CastSum, CrossNodeSum, cross_node_channel, sum_for
from scalesgd.comm.engine.fsdp_units import units_of
from scalesgd.comm.engine.optimizer import IterationStats

COMPUTE = {"fp32": None, "bf16": torch.bfloat16}  # --precision → the dtype the shards are gathered to for compute
GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors on rank 0, as a checkpoint keeps


def shard_model(model: nn.Module, units: Iterable[nn.Module] = (), precision: str = "fp32", mesh=None,
                reduce_dtype: torch.dtype = torch.float32) -> nn.Module:
    """Shard each unit (a GPT block, a ResNet stage: one all-gather and one reduce-scatter each), then the root (what
    is left: embeddings, head); under bf16 the units compute with bf16 copies of fp32 shards, the root returns fp32.
    `reduce_dtype` is what FSDP2's own reduce-scatter sends (the codec's sum replaces it under our sharded engine).

    Collective: every rank, together, before the optimizer is built on `model.parameters()` (the shards)."""
    if precision not in COMPUTE:
        raise ValueError(f"precision {precision!r}: the sharded engine computes in fp32 or bf16 (fp16 would need a "
                         "loss scaler over the shards)")
    dtype = COMPUTE[precision]
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=reduce_dtype, output_dtype=torch.float32 if dtype is not None else None))
    return model


def sharded_within_nodes(model: nn.Module) -> bool:
    """Whether `shard_model` sharded `model` over fewer ranks than the world (each node's: the hybrid layout)."""
    mesh = getattr(next(model.parameters(), None), "device_mesh", None)
    return mesh is not None and mesh.size() < dist.get_world_size()


def shard_layout(model: nn.Module) -> list[int]:
    """Which shards this rank holds of a model `shard_model` sharded: its place among the ranks sharing it, their
    number, and the world's size (state kept for one rank's shards is this rank's only where all three agree)."""
    mesh = next(model.parameters()).device_mesh
    dim = mesh.ndim - 1  # the dim it shards over (a hybrid mesh replicates over the first)
    return [mesh.get_local_rank(dim), mesh.size(dim), dist.get_world_size()]


def node_mesh(groups, device: torch.device) -> DeviceMesh:
    """The mesh of this rank's node (`TopologyGroups.node_group`): the hybrid layout shards within it."""
    return DeviceMesh.from_group(groups.node_group, device.type)


def hybrid_mesh(groups, device: torch.device) -> DeviceMesh:
    """FSDP2's own hybrid layout: replicated across nodes (`cross_group`, dim 0), sharded within each (dim 1); ranks
    are numbered node by node."""
    per_node, world = dist.get_world_size(groups.node_group), dist.get_world_size()
    return DeviceMesh.from_group([groups.cross_group, groups.node_group], device.type,
                                 mesh=torch.arange(world).view(world // per_node, per_node),
                                 mesh_dim_names=("replicate", "shard"))


class FsdpExchange(GradientExchange):
    """FSDP2 on a model `shard_model` sharded: accumulation without the reduce-scatter
    (`set_requires_gradient_sync`), each module's reduce-scatter through the codec (`comm/engine/fsdp_sums.py`);
    checkpoints keep each rank's shards of the parameters and the optimizer's state (`torch.distributed.checkpoint`),
    which any number of ranks loads, and the codec's state, which the same layout of shards loads.

    `across_nodes` False: a model sharded within each node sums only there (periodic synchronisation across nodes is
    `periodic.exchange`'s, over this engine)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, setup: ExchangeSetup,
                 across_nodes: bool = True):
        if not isinstance(model, FSDPModule):
            raise ValueError("the sharded engine takes a model sharded by shard_model (FSDP2's fully_shard), and an "
                             "optimizer built on its parameters after that")
        self._codec = make_codec(setup.codec, setup.settings)
        self._layout = shard_layout(model)
        self._parts, driver = self._install(model, setup, across_nodes)
        self._counted = (0.0, 0)
        # bf16 compute is FSDP's own (`shard_model`'s policy), so the base's autocast stays off
        super().__init__(model, optimizer, driver, bare=model, norms=setup.norms, clip_norm=setup.clip_norm)

    def _install(self, model: FSDPModule, setup: ExchangeSetup, across_nodes: bool) -> tuple[list, BucketDriver | None]:
        """Each unit's reduce-scatter as the codec's registration says (`fsdp_sums.sum_for`): a cast's, one ending
        in the shards or one of the whole unit through the codec's driver; hybrid: the node's in fp32, then,
        `across_nodes`, the cross-node mean of the unit's shard through the codec's driver. The parts that count
        bytes and time, and the driver (None where a cast is the whole sum)."""
        units, entry = units_of(model), CODECS[self._codec.name]
        hybrid = sharded_within_nodes(model)
        if hybrid and across_nodes and setup.topology is None:
            raise ValueError("a model sharded within each node needs the node and cross-node groups (`topology`)")
        kind, driver = CastSum if hybrid else sum_for(entry), None
        if kind is CastSum:  # the node's sum, or the whole sum, in the cast's dtype
            parts = [CastSum(make_codec(DENSE.name, setup.settings), torch.float32) if hybrid
                     else CastSum(self._codec, entry.cast)]
        else:  # on the ring of FSDP's mesh
            channel = open_channel(self._codec, next(model.parameters()).device_mesh.get_group(), setup.topology,
                                   scatter=entry.scatters)
            driver = BucketDriver(self._codec, channel, dense_steps=setup.compress_after)
            parts = [kind(driver, unit, entry.reads_weights) for unit in units if unit.params]
        if hybrid and across_nodes:
            driver = BucketDriver(self._codec, cross_node_channel(setup.topology, entry.needs_topology),
                                  dense_steps=setup.compress_after)
            parts.append(CrossNodeSum(driver))
        summed = iter(parts)
        for unit in units:
            if kind is CastSum:
                unit.sum_with(parts[0])
            elif unit.params:  # (a unit with no parameters of its own has no reduce-scatter)
                unit.sum_with(next(summed))
                if entry.reads_weights:
                    unit.keep_gathered_through_backward()  # its weights, gathered, are the codec's at the sum
            if hybrid and across_nodes and unit.params:
                unit.across_nodes_with(parts[-1].hook(unit))
        self._gathered_to_step = kind is not CastSum and entry.reads_weights
        return parts, driver

    @classmethod
    def codec_site(cls, model: nn.Module) -> str | None:
        return CROSS_NODE_SHARDS if sharded_within_nodes(model) else None

    @classmethod
    def mesh(cls, groups, device: torch.device) -> DeviceMesh | None:
        """Where this engine lays the shards out: over every rank (None), or within each node where the node groups
        are given (the cross-node sum is the codec's all-reduce hook)."""
        return node_mesh(groups, device) if groups is not None else None

    @classmethod
    def reduce_dtype(cls, codec: str) -> torch.dtype:
        """FSDP2's own reduce dtype: fp32, which the codec's sum replaces."""
        return torch.float32

    @classmethod
    def shard(cls, model: nn.Module, units: Iterable[nn.Module], precision: str, codec: str, groups=None,
              device: torch.device = torch.device("cpu")) -> nn.Module:
        """`shard_model` as this engine lays it out, for `codec`."""
        return shard_model(model, units, precision, cls.mesh(groups, device), cls.reduce_dtype(codec))

    @staticmethod
    def uses_own_group(codec) -> bool:
        return False  # the reduce-scatter runs in FSDP's mesh (every rank, or the node's), no group of its own

    def step(self) -> bool:
        stepped = super().step()
        if self._gathered_to_step:  # the gathered weights the codec read are the old ones now
            self.reshard()
        return stepped

    def autocast(self) -> AbstractContextManager:
        return nullcontext()

    @contextmanager
    def evaluated(self) -> Iterator[None]:
        """Every unit resharded on both sides of an evaluation: the root keeps what a forward without backward
        gathered, which would otherwise stand for the shards in what follows (other parameters put in place, a
        state dict)."""
        self.reshard()
        try:
            yield
        finally:
            self.reshard()

    def layout(self) -> list[int]:
        return self._layout

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def stats(self) -> IterationStats:
        """The reduce-scatters' (and cross-node sums') bytes and time since the last call (on CPU they run inside
        backward, exposed)."""
        total = (sum(p.seconds for p in self._parts), sum(p.bytes_sent for p in self._parts))
        seconds, sent = total[0] - self._counted[0], total[1] - self._counted[1]
        self._counted = total
        return IterationStats(comm_s=seconds, exposed_s=seconds, bytes_sent=sent)

    def counters(self) -> dict[str, float]:
        return self._codec.counters()

    def reshard(self) -> None:
        """Every unit back to its shards: the root keeps its parameters gathered after a forward without backward
        (an evaluation's), and state dicts name the shards the optimizer steps."""
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def model_state(self, model: nn.Module) -> dict:
        self.reshard()
        return get_model_state_dict(model, options=GATHERED)

    def state_dict(self) -> dict:
        """The optimizer's state is in the shards (`sharded_state`); the codec's is this rank's, as the shards it
        was kept for are (their layout beside it: `load_state_dict`)."""
        codec = None if self.driver is None else {"layout": self._layout, "driver": self.driver.state_dict()}
        return {"optimizer": None, "codec": codec, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """The codec's state where it was kept for these shards (`shard_layout`); otherwise it starts afresh:
        residuals, ranges and momenta kept for other shards are not this rank's. The optimizer's state comes back
        with the shards (`load_sharded_state`)."""
        saved = state.get("codec")
        if self.driver is not None and saved and saved.get("layout") == self._layout:
            self.driver.load_state_dict(saved["driver"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def optimizer_state(self) -> dict:
        """The optimizer's state whole on rank 0 (collective), keyed by parameter names: any world size loads it."""
        self.reshard()
        return get_optimizer_state_dict(self.model, self.optimizer, options=GATHERED)

    def sharded_state(self, model: nn.Module) -> dict:
        self.reshard()
        weights, optimizer = get_state_dict(model, self.optimizer)
        return {"model": weights, "optimizer": optimizer}

    def load_sharded_state(self, model: nn.Module, folder) -> None:
        state = self.sharded_state(model)
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


class Fsdp2Exchange(FsdpExchange):
    """FSDP2 as it comes, for comparison (as `ddp` is DDP): its own reduce-scatter in the codec's dtype (the mixed
    precision policy's `reduce_dtype`) and its own hybrid layout on a 2-D mesh (`hybrid_mesh`); nothing counted from
    inside (on the testbed the link counts its bytes)."""

    def _install(self, model: FSDPModule, setup: ExchangeSetup, across_nodes: bool) -> tuple[list, None]:
        self._gathered_to_step = False
        return [], None

    @classmethod
    def codec_site(cls, model: nn.Module) -> str | None:
        return None  # its own all-reduce across nodes, in the reduce dtype

    @classmethod
    def mesh(cls, groups, device: torch.device) -> DeviceMesh | None:
        """Its own hybrid layout where the node groups are given: a 2-D mesh, replicated across nodes."""
        return hybrid_mesh(groups, device) if groups is not None else None

    @classmethod
    def reduce_dtype(cls, codec: str) -> torch.dtype:
        """Its own reduce-scatter in the codec's dtype (a cast's)."""
        return CODECS[codec].cast or torch.float32

    def stats(self) -> IterationStats | None:
        return None
