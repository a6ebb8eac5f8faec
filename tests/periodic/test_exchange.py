"""Periodic synchronisation over the engine each replica runs inside itself: a node's ranks under FSDP2's shards, DDP
or our engine, each node one DiLoCo worker — the same as DiLoCo around a model whose node averages its gradients —
and a rank's own state kept only for the same layout."""

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.engine.exchange import ExchangeSetup, build_exchange
from scalesgd.comm.engine.fsdp import FsdpExchange, node_mesh, shard_model
from scalesgd.comm.engine.fsdp_sums import cross_node_channel
from scalesgd.comm.wire.topology import Topology, build_groups
from scalesgd.models import GPT, MODELS
from scalesgd.models.gpt import GptOptions
from scalesgd.periodic import DiLoCo, outer_sgd
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.periodic.exchange import PeriodicExchange
from tests.spawn_util import run_workers

VOCAB, STEPS, H = 64, 6, 3


def gpt():
    torch.manual_seed(0)
    return GPT(VOCAB, GptOptions(layers=2, heads=2, width=16, block=8))


def loss(model, rank, step):
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(100 * rank + step))
    return torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())


def replica_against_node_averaged(rank, world, engine):
    groups = build_groups(Topology(world, rank, 2))
    model = gpt()  # the reference: whole on every rank, the node's mean gradient, DiLoCo across nodes
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with DiLoCo(model, inner, H, outer_optimizer=lambda own: outer_sgd(own), group=groups.cross_group) as diloco:
        for step in range(STEPS):
            loss(model, rank, step).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, group=groups.node_group)
                p.grad /= 2
            inner.step()
            inner.zero_grad()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    model = gpt()
    inside = ExchangeSetup(topology=groups, group=groups.node_group, process_group=groups.node_group)
    if engine == "scalesgd-fsdp":
        shard_model(model, MODELS["gpt"].shard_units(model), mesh=node_mesh(groups, torch.device("cpu")))
        inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
        within = FsdpExchange(model, inner, inside, across_nodes=False)
    else:
        inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
        within = build_exchange(engine, model, inner, inside)
    across = cross_node_channel(groups, False)
    exchange = PeriodicExchange(within, ExchangeSetup(group=across.group, topology=across.topology),
                                PeriodicConfig(local_steps=H))
    for step in range(STEPS):
        exchange.backward(loss(exchange.model, rank, step))
        exchange.step()
        inner.zero_grad()
    saved = exchange.state_dict()
    exchange.load_state_dict({**saved, "replica": {**saved["replica"], "layout": [9, 9, 9]}})  # another layout's
    restarted = [g.clone() for g in exchange.diloco.global_params]
    whole = exchange.model_state(model)
    exchange.close()
    return reference, whole, diloco.rounds, exchange.diloco.rounds, restarted, [
        p.detach().clone() for p in exchange.diloco.params]


@pytest.mark.parametrize("engine", ["scalesgd-fsdp", "ddp", "scalesgd"])
def test_each_node_is_one_diloco_worker_whatever_engine_runs_inside_it(engine):
    ranks = run_workers(replica_against_node_averaged, 4, engine)
    reference, whole = ranks[0][:2]  # a sharded model is gathered whole on rank 0
    for name, tensor in reference.items():
        assert torch.allclose(whole[name], tensor, rtol=0, atol=1e-6), name
    for _, _, rounds, replica_rounds, restarted, local in ranks:
        assert rounds == replica_rounds == STEPS // H
        # state kept for another layout is not this rank's: the global parameters start again from the local ones
        assert all(torch.equal(g, p) for g, p in zip(restarted, local))
