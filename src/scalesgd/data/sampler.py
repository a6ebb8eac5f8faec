"""Per-rank index sampler that shares one permutation per epoch across all ranks (Goyal et al., Remark 4)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler


class GlobalBatchSampler(Sampler[list[int]]):
    """Yield this rank's share of each global batch cut from one shared per-epoch permutation.

    Why not ``DistributedSampler``: it shuffles, then either pads the index list with
    duplicates or drops the tail so every rank gets the same count, and it deals indices
    round-robin with a fixed per-rank batch size. That changes the effective data (some
    samples seen twice or never per epoch) and hides the real global batch. Here the whole
    training set is permuted once per epoch (same permutation on every rank, seeded from
    ``(seed, epoch)``), cut into consecutive global batches of ``global_batch`` samples, and
    each global batch is split into consecutive rank shares whose sizes differ by at most
    one (the first ``m % world_size`` ranks take one extra). A final partial global batch
    that would leave some rank with fewer than ``min_per_rank`` samples (BatchNorm needs
    more than one) is merged into the previous global batch rather than dropped. So every
    sample is used exactly once per epoch, no sample reaches two ranks, no rank batch is
    empty, and all ranks yield the same number of batches (they must run the same number
    of collective steps). Because step sizes can vary, ``global_counts(step)`` gives the
    total sample count of a step so the summed loss can be divided by it, making the
    all-reduced gradient the mean over all samples of the step (Remark 3).
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        world_size: int,
        rank: int,
        seed: int = 0,
        min_per_rank: int = 2,
    ) -> None:
        for name, value in (
            ("num_samples", num_samples),
            ("global_batch", global_batch),
            ("world_size", world_size),
            ("rank", rank),
            ("seed", seed),
            ("min_per_rank", min_per_rank),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"GlobalBatchSampler {name} must be an int, got {value!r}")
        if world_size < 1:
            raise ValueError(f"GlobalBatchSampler world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"GlobalBatchSampler rank must be in [0, {world_size - 1}], got {rank}")
        if min_per_rank < 1:
            raise ValueError(f"GlobalBatchSampler min_per_rank must be >= 1, got {min_per_rank}")
        if seed < 0:
            raise ValueError(f"GlobalBatchSampler seed must be >= 0, got {seed}")
        if not num_samples >= global_batch >= world_size * min_per_rank:
            raise ValueError(
                "GlobalBatchSampler needs num_samples >= global_batch >= world_size * min_per_rank, got "
                f"num_samples={num_samples}, global_batch={global_batch}, "
                f"world_size * min_per_rank={world_size} * {min_per_rank}={world_size * min_per_rank}"
            )
        self.num_samples = int(num_samples)
        self.global_batch = int(global_batch)
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.seed = int(seed)
        self.min_per_rank = int(min_per_rank)
        self.epoch = 0
        self._held: tuple[int, torch.Tensor] | None = None  # `share`'s permutation, by epoch
        self._bounds = _global_batch_bounds(self.num_samples, self.global_batch, self.world_size, self.min_per_rank)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration uses; call it identically on every rank."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"GlobalBatchSampler epoch must be an int >= 0, got {epoch!r}")
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self._bounds)

    def __iter__(self) -> Iterator[list[int]]:
        permutation = self._permutation()
        for start, stop in self._bounds:
            lo, hi = _rank_share(stop - start, self.world_size, self.rank)
            yield permutation[start + lo : start + hi].tolist()

    def global_counts(self, step_in_epoch: int) -> int:
        """Total samples across all ranks at this step, the divisor that makes the reduced gradient a mean."""
        if not 0 <= step_in_epoch < len(self._bounds):
            raise IndexError(f"step_in_epoch must be in [0, {len(self._bounds) - 1}], got {step_in_epoch}")
        start, stop = self._bounds[step_in_epoch]
        return stop - start

    def share(self, step_in_epoch: int, rank: int) -> list[int]:
        """Rank `rank`'s share of the global batch `step_in_epoch` of the epoch set last (whoever asks for it)."""
        start, stop = self._bounds[step_in_epoch]
        lo, hi = _rank_share(stop - start, self.world_size, rank)
        if self._held is None or self._held[0] != self.epoch:
            self._held = (self.epoch, self._permutation())
        return self._held[1][start + lo : start + hi].tolist()

    def _permutation(self) -> torch.Tensor:
        """The epoch's permutation of the whole training set, identical on every rank."""
        # SeedSequence mixes (seed, epoch) so that, unlike seed + epoch, (0, 1) and (1, 0) differ.
        mixed = int(np.random.SeedSequence([self.seed, self.epoch]).generate_state(1, dtype=np.uint64)[0])
        generator = torch.Generator().manual_seed(mixed)
        return torch.randperm(self.num_samples, generator=generator)


def _global_batch_bounds(num_samples: int, global_batch: int, world_size: int, min_per_rank: int) -> list[tuple[int, int]]:
    """Cut [0, num_samples) into global batches, merging a too-small tail into the previous batch."""
    bounds = [(start, start + global_batch) for start in range(0, num_samples - global_batch + 1, global_batch)]
    tail_start = bounds[-1][1]
    if tail_start < num_samples:
        if (num_samples - tail_start) // world_size >= min_per_rank:
            bounds.append((tail_start, num_samples))
        else:
            bounds[-1] = (bounds[-1][0], num_samples)
    return bounds


def _rank_share(batch_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """Offsets of `rank`'s consecutive share of a global batch; the first batch_size % world_size ranks get one more."""
    base, extra = divmod(batch_size, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)
