"""Periodic synchronisation as the training loop's exchange: backward and the inner step are the worker's alone,
and every H steps `DiLoCo` synchronises; evaluation reads the global parameters."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from scalesgd.comm.codecs import make_codec
from scalesgd.comm.engine.exchange import ExchangeSetup, GradientExchange
from scalesgd.comm.engine.optimizer import IterationStats
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.periodic.diloco import DiLoCo
from scalesgd.periodic.outer import outer_sgd


class PeriodicExchange(GradientExchange):
    """No exchange in backward; `step` steps this worker's optimizer, and `DiLoCo`'s hook on it synchronises every
    `local_steps` steps through the run's codec. The checkpoint holds every rank's own local parameters and inner
    optimizer state beside the global ones."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, setup: ExchangeSetup,
                 periodic: PeriodicConfig):
        self.diloco = DiLoCo(model, optimizer, periodic.local_steps,
                             outer_optimizer=lambda own: outer_sgd(own, periodic.outer_lr, periodic.outer_momentum),
                             codec=make_codec(setup.codec, setup.settings), fragments=periodic.fragments,
                             delay=periodic.overlap_steps, mix=periodic.mix, group=setup.group,
                             topology=setup.topology)
        self.diloco.__enter__()
        self._bytes = self.diloco.bytes_sent
        self._landed = 0.0
        super().__init__(model, optimizer, None, bare=model, precision=setup.precision, clip_norm=setup.clip_norm)
        # the pseudo-gradient is no loss-scaled gradient: the driver is not told of fp16's scaler
        self.driver, self.codec = self.diloco.driver, self.diloco.codec

    def no_sync(self) -> AbstractContextManager:
        return nullcontext()

    def step(self) -> bool:
        start = time.perf_counter()
        rounds = self.diloco.rounds
        stepped = super().step()
        if self.diloco.rounds != rounds:  # a landing (and, without overlap, its exchange) ran in this step
            self._landed += time.perf_counter() - start
        return stepped

    def evaluated(self) -> AbstractContextManager:
        return self.diloco.global_model()

    def settle(self) -> None:
        self.diloco.finish()

    def stats(self) -> IterationStats:
        """The bytes of the exchanges that landed since the last call, and the time the step spent landing them."""
        sent, self._bytes = self.diloco.bytes_sent - self._bytes, self.diloco.bytes_sent
        exposed, self._landed = self._landed, 0.0
        return IterationStats(exposed_s=exposed, bytes_sent=sent)

    def state_dict(self) -> dict:
        """Every rank's own state travels as its "codec" state: the round's, its local parameters and its inner
        optimizer's (the workers' differ between synchronisations)."""
        own = {"periodic": self.diloco.state_dict(), "local": [p.detach().clone() for p in self.diloco.params],
               "inner": self.optimizer.state_dict()}
        return {"optimizer": self.optimizer.state_dict(), "codec": own, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        own = state.get("codec")
        self.optimizer.load_state_dict(own["inner"] if own else state["optimizer"])
        if own:
            self.diloco.load_state_dict(own["periodic"])
            with torch.no_grad():
                for p, local in zip(self.diloco.params, own["local"]):
                    p.copy_(local)
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def close(self) -> None:
        self.diloco.__exit__(None, None, None)
