"""Periodic synchronisation as the training loop's exchange, composed over the engine each replica runs inside itself:
nothing for a one-process replica (`LocalExchange`), DDP or ours over a node's ranks, or the sharded engine's shards
within a node (FSDP2's hybrid layout with DiLoCo across nodes, as INTELLECT-1 and torchtitan lay it out). Backward,
accumulation and the inner step are the replica's engine's; every H steps `DiLoCo` synchronises the replicas through
the run's codec; evaluation reads the global parameters."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn

from scalesgd.comm.codecs import make_codec
from scalesgd.comm.engine.base import ExchangeSetup, GradientExchange
from scalesgd.comm.engine.optimizer import IterationStats
from scalesgd.optim._batched import local
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.periodic.diloco import DiLoCo
from scalesgd.periodic.outer import outer_sgd


class PeriodicExchange(GradientExchange):
    """`within` (the replica's own engine, built on the model and inner optimizer) every step, and `DiLoCo` over the
    replicas (`setup`: the run's codec, in the replicas' group) every `periodic.local_steps` steps, counted after
    every step whether or not fp16's scaler skipped it. Checkpoints keep the engine's state, and each rank's own
    (`replica`: the round's, its local parameters and its inner optimizer's; replicas differ between rounds)."""

    def __init__(self, within: GradientExchange, setup: ExchangeSetup, periodic: PeriodicConfig,
                 resume: dict | None = None):
        self.within = within
        self.diloco = DiLoCo(within.bare, inner_of(within.optimizer), periodic.schedule,
                             outer_optimizer=lambda own: outer_sgd(own, periodic.outer_lr, periodic.outer_momentum),
                             codec=make_codec(setup.codec, setup.settings), mix=periodic.mix, carry=periodic.carry,
                             group=setup.group, topology=setup.topology, resume=resume)
        self._bytes, self._landed = self.diloco.bytes_sent, 0.0
        super().__init__(within.model, within.optimizer, self.diloco.driver, within.plan, bare=within.bare,
                         precision=within.precision, clip_norm=within.clip_norm, scaler=within.scaler)

    # ---- each step: the replica's engine ------------------------------------------------------------
    def autocast(self) -> AbstractContextManager:
        return self.within.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.within.backward(loss)

    def no_sync(self) -> AbstractContextManager:
        return self.within.no_sync()

    def synchronize(self) -> None:
        self.within.synchronize()

    def step(self) -> bool:
        """The replica's step, then a step of the round (the synchronisation where one is due)."""
        stepped = self.within.step()
        start, rounds = time.perf_counter(), self.diloco.rounds
        self.diloco.after_inner_step()
        if self.diloco.rounds != rounds:  # a landing (and, without overlap, its exchange) ran in this step
            self._landed += time.perf_counter() - start
        return stepped

    # ---- the run's view ---------------------------------------------------------------------------------
    @contextmanager
    def evaluated(self) -> Iterator[None]:
        with self.within.evaluated(), self.diloco.global_model():
            yield

    def settle(self) -> None:
        self.within.settle()
        self.diloco.finish()

    def stats(self) -> IterationStats:
        """The replica's own exchange and the rounds that landed since the last call: their bytes, and the time the
        steps spent landing them."""
        inside = self.within.stats() or IterationStats()
        sent, self._bytes = self.diloco.bytes_sent - self._bytes, self.diloco.bytes_sent
        exposed, self._landed = self._landed, 0.0
        return IterationStats(comm_s=inside.comm_s, exposed_s=inside.exposed_s + exposed,
                              bytes_sent=inside.bytes_sent + sent)

    # ---- checkpoints: the engine's state, and this replica's own ----------------------------------------
    def model_state(self, model: nn.Module) -> dict:
        return self.within.model_state(model)

    def sharded_state(self, model: nn.Module) -> dict | None:
        return self.within.sharded_state(model)

    def load_sharded_state(self, model: nn.Module, folder) -> None:
        self.within.load_sharded_state(model, folder)

    def state_dict(self) -> dict:
        inner = inner_of(self.optimizer)
        own = {"layout": self.within.layout(), "periodic": self.diloco.state_dict(),
               "local": [p.detach().clone() for p in self.diloco.params],
               "inner": [{k: local([v])[0].clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
                         for state in stepped_state(inner)]}
        return {**self.within.state_dict(), "replica": own}

    def load_state_dict(self, state: dict) -> None:
        """The engine's state, then this rank's own where it was kept for the same layout (whole models: any, the
        old replicas' averaged where their number changed); otherwise the global parameters start from the loaded
        ones (the outer momentum and the codec's state afresh)."""
        self.within.load_state_dict(state)
        own = state.get("replica")
        if not own or own.get("layout") != self.within.layout():
            self.diloco.restart()
            return
        self.diloco.load_state_dict(own["periodic"])
        self._bytes = self.diloco.bytes_sent  # what it sent before the checkpoint is the run's already (its clock's)
        with torch.no_grad():
            for p, saved in zip(self.diloco.params, own["local"]):
                p.copy_(saved)
        load_inner(inner_of(self.optimizer), own["inner"])

    def close(self) -> None:
        self.diloco.__exit__(None, None, None)
        self.within.close()


def inner_of(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer a replica's engine steps (ours wraps it)."""
    return getattr(optimizer, "optimizer", optimizer)


def stepped_state(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The state of each parameter the optimizer holds state for, in its order."""
    return [optimizer.state[p] for group in optimizer.param_groups for p in group["params"] if optimizer.state[p]]


def load_inner(optimizer: torch.optim.Optimizer, saved) -> None:
    """This rank's inner optimizer state, into the state loaded for every rank (its shards' where sharded): per
    parameter in the optimizer's order; or, from an earlier version, a whole `state_dict` (whole models) or each
    parameter's values in order (shards)."""
    if isinstance(saved, dict):
        optimizer.load_state_dict(saved)
        return
    with torch.no_grad():
        for state, mine in zip(stepped_state(optimizer), saved):
            for key, value in (mine.items() if isinstance(mine, dict) else zip(list(state), mine)):
                if isinstance(state.get(key), torch.Tensor):
                    local([state[key]])[0].copy_(value)
                else:
                    state[key] = value
