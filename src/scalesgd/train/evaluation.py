"""Evaluation: at each epoch's end, and every --eval-every steps on a clock that leaves evaluations and checkpoints
out (what a time-to-quality comparison reads), with --time-budget's stop on that clock."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from scalesgd.comm.wire.membership import Membership
from scalesgd.data.pipeline import FolderPipeline
from scalesgd.runtime.link import link_bytes_sent
from scalesgd.runtime.process_group import sync_buffers
from scalesgd.train.objective import Objective, throughput_key

@dataclass
class Milestones:
    """The run's training clock (seconds since its first step, evaluations left out, checkpoints kept in: a run
    that checkpoints reaches its target that much later), the bytes this rank's exchange sent and its node's link
    sent (evaluations' left out), when to evaluate (`every` steps; 0: at epochs' ends only) and when to stop
    (`budget_s` seconds on that clock; 0: never)."""

    every: int = 0
    budget_s: float = 0.0
    offset_s: float = 0.0  # the clock's reading where the run resumed
    bytes_sent: int | None = None  # None where the exchange does not count them (DDP's own)
    stopped: bool = False  # the budget was spent: the run ended early
    checkpoint_s: float = 0.0  # of the clock, the checkpoints' seconds (with the resumed run's)
    checkpoint_link_bytes: int | None = None  # what this node's link sent while checkpointing; None off the testbed

    def __post_init__(self):
        self._start, self._paused = time.perf_counter(), 0.0
        self._link_start, self._link_paused = link_bytes_sent(), 0

    def link_bytes(self) -> int | None:
        """What this node's testbed link sent since the clock started (every collective's bytes); None off it."""
        now = link_bytes_sent()
        return now - self._link_start - self._link_paused if now is not None and self._link_start is not None else None

    def train_s(self) -> float:
        return self.offset_s + time.perf_counter() - self._start - self._paused

    def paused(self):
        """Leave what runs inside (an evaluation) off the training clock and the link's count."""
        return self._measured(self._leave_out)

    def checkpointing(self):
        """Keep what runs inside (a checkpoint) on the clock and the link's count, and its seconds and link bytes
        apart too, to show what checkpoints cost."""
        return self._measured(self._tally_checkpoint)

    @contextmanager
    def _measured(self, add):
        """`add(seconds, link bytes)` of what runs inside (link bytes None off the testbed), however it ends."""
        start, sent = time.perf_counter(), link_bytes_sent()
        try:
            yield
        finally:
            now = link_bytes_sent()
            add(time.perf_counter() - start, now - sent if now is not None and sent is not None else None)

    def _leave_out(self, seconds: float, link_bytes: int | None) -> None:
        self._paused += seconds
        self._link_paused += link_bytes or 0

    def _tally_checkpoint(self, seconds: float, link_bytes: int | None) -> None:
        self.checkpoint_s += seconds
        if link_bytes is not None:
            self.checkpoint_link_bytes = (self.checkpoint_link_bytes or 0) + link_bytes

    def reading(self) -> dict:
        """The clock and the bytes now, as a checkpoint keeps them for the run that resumes from it (the one being
        written counted by the run that writes it)."""
        return {"train_s": self.train_s(), "bytes_sent": self.bytes_sent, "checkpoint_s": self.checkpoint_s,
                "checkpoint_link_bytes": self.checkpoint_link_bytes}

    def count(self, timing: dict) -> None:
        """Add a step's bytes, where the exchange counts them."""
        if "bytes_sent" in timing:
            self.bytes_sent = (self.bytes_sent or 0) + timing["bytes_sent"]

    def due(self, iteration: int) -> bool:
        return self.every > 0 and iteration % self.every == 0

    def spent(self) -> bool:
        """Whether the time budget is spent (rank 0's clock decides: the loop shares its answer)."""
        return self.budget_s > 0 and self.train_s() >= self.budget_s


def evaluate_at(run, epoch: int, iteration: int) -> dict:
    """An evaluation between steps of the loop's `Run`, off the clock: the model as the run reports it, with the
    training seconds (and of them the checkpoints'), this rank's bytes and (on the testbed) its node's link's bytes
    so far."""
    clock = run.milestones
    train_s, began = clock.train_s(), time.perf_counter()
    with clock.paused():
        sync_buffers(run.model, run.env.members)
        with run.exchange.evaluated():
            test = evaluate(run.model, run.pipeline.test_batches(run.env.rank, run.env.world_size), run.objective,
                            run.env.members, run.exchange.autocast)
        run.model.train()
    link = clock.link_bytes()
    return {"kind": "eval", "epoch": epoch, "iter": iteration, "train_s": train_s, "at": time.time(),
            "eval_s": time.perf_counter() - began, "checkpoint_s": clock.checkpoint_s,
            **({"bytes_sent": clock.bytes_sent} if clock.bytes_sent is not None else {}),
            **({"link_bytes_sent": link} if link is not None else {}),
            **({"checkpoint_link_bytes": clock.checkpoint_link_bytes}
               if clock.checkpoint_link_bytes is not None else {}), **test}

def end_epoch(run, epoch: int, totals: torch.Tensor, images_per_s: float) -> dict:
    """Evaluate with rank 0's BN statistics (as DDP's forward would use them); the epoch's record. Every rank learns
    the files the others skipped, so none names one again in a later epoch."""
    began = time.perf_counter()
    sync_buffers(run.model, run.env.members)
    with run.exchange.evaluated():
        test = evaluate(run.model, run.pipeline.test_batches(run.env.rank, run.env.world_size), run.objective,
                        run.env.members, run.exchange.autocast)
    if skips_bad_files(run):
        run.pipeline.skipped = skipped_files(run)
    return {"kind": "epoch", "epoch": epoch, "iter": epoch * len(run.sampler), "at": time.time(),
            "eval_s": time.perf_counter() - began,
            "train_loss": totals[0].item() / totals[2].item(), "train_acc": totals[1].item() / totals[2].item(),
            **test, throughput_key(run.data.is_text): images_per_s,
            "lr": run.exchange.optimizer.param_groups[0]["lr"]}


@torch.no_grad()
def evaluate(model: nn.Module, batches, objective: Objective, members: Membership | None,
             autocast=nullcontext) -> dict:
    """Test loss (per prediction, without label smoothing) and accuracy (and a language model's perplexity) over
    this rank's shard of the test set (`batches`), in the run's precision, summed across the members (None: this
    process evaluated all of it)."""
    model.eval()
    plain = Objective(objective.text, 0.0, objective.predictions_per_sample)
    sums = torch.zeros(3, dtype=torch.float64)
    for x, y in batches:
        with autocast():
            loss_sum, correct = plain(model(x), y)
        sums[0] += loss_sum.item()
        sums[1] += correct.item()
        sums[2] += y.numel()
    if members is not None:
        members.all_reduce(sums)
    return objective.evaluated((sums[0] / sums[2]).item(), (sums[1] / sums[2]).item())


def skips_bad_files(run) -> bool:
    """Whether the run streams files and leaves out those that cannot be decoded."""
    return isinstance(run.pipeline, FolderPipeline) and run.cfg.data.skip_bad_images


def skipped_files(run) -> dict[str, str]:
    """Every file any rank skipped (path: what is wrong), gathered (collective)."""
    everyone = run.env.members.all_gather_object(run.pipeline.skipped)
    return {path: what for ranks in everyone for path, what in ranks.items()}


