"""Per-parameter codec state kept flat in each bucket's layout: a codec works on whole buckets (one kernel over the
bucket's residual, its momentum) while every value stays keyed by its parameter, so DDP's bucket rebuild after the
first step, a resume and any other grouping find each parameter's state where they need it.

    state = FlatState(("residual", "momentum"))
    held = state.of(bucket, flat)        # held.tensors["residual"]: the bucket's, flat; held.new: made just now
    state.state_dict() / load_state_dict(...)   # by parameter key

A bucket view without parameters (a part of a bucket that no parameter owns alone: 1-bit Adam's server part,
top-k-nodes' shard) is one region of its own, keyed by the tuple of its bucket's parameter keys (or by its index
where it has none), and is never cut up or carried over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scalesgd.comm.codecs.base import BucketView


@dataclass
class Held:
    """One bucket's state: the keys it is held under, its flat tensors by name, and whether `of` made it just now
    (a bucket of parameters grouped as none before: what the codec keeps per bucket starts afresh)."""

    keys: tuple[int, ...]
    tensors: dict[str, torch.Tensor]
    new: bool = True


def keys_of(bucket: BucketView) -> tuple[int, ...]:
    """The keys a bucket's state is held under: its parameters' (a view without parameters, a region, is held
    under its bucket's, or its index where it has none)."""
    return tuple(bucket.keys) or (-1 - bucket.index,)


def parameters_of(bucket: BucketView) -> list[tuple[int, int, int]]:
    """(key, offset, size) of each parameter in a bucket; none for a region."""
    return [(key, start, p.numel()) for key, start, p in zip(bucket.keys, bucket.offsets, bucket.params)]


class FlatState:
    """Named flat tensors per bucket, each parameter's slice a view of them, keyed by parameter."""

    def __init__(self, names: tuple[str, ...], dtype: torch.dtype | None = None):
        self.names = names
        self.dtype = dtype  # None: the gradients' own; else at least this wide (float32 for float16 gradients)
        self._held: dict[tuple[int, ...], Held] = {}  # bucket keys → its state
        self._params: dict[int, dict[str, torch.Tensor]] = {}  # parameter key → its slices (views)
        self._loaded: dict[int, dict[str, torch.Tensor]] = {}  # loaded, not yet claimed by a bucket

    def of(self, bucket: BucketView, like: torch.Tensor) -> Held:
        """The bucket's state; made now (zeros, or each parameter's kept and loaded slices carried over) when the
        bucket holds other parameters than any before."""
        keys = keys_of(bucket)
        held = self._held.get(keys)
        if held is not None and all(t.numel() == like.numel() for t in held.tensors.values()):
            held.new = False
            return held
        params = parameters_of(bucket)  # only where the layout is made: the step's path is the lookup above
        dtype = like.dtype if self.dtype is None else torch.promote_types(like.dtype, self.dtype)
        held = Held(keys, {name: torch.zeros(like.numel(), dtype=dtype, device=like.device) for name in self.names})
        loaded = self._loaded.pop(keys, None) if not params else None  # a region comes back whole
        if loaded is not None and all(loaded[n].numel() == like.numel() for n in self.names):
            for name in self.names:
                held.tensors[name].copy_(loaded[name].reshape(-1))
        for key, start, size in params:
            slices = {name: held.tensors[name][start:start + size] for name in self.names}
            old = self._params.get(key) or self._loaded.pop(key, None)
            if old is not None and all(old[n].numel() == size for n in self.names):
                for name in self.names:
                    slices[name].copy_(old[name].reshape(-1))
            self._params[key] = slices
        if params:
            self._held = {k: h for k, h in self._held.items() if not set(k) & set(keys)}
        self._held[keys] = held
        return held

    def find(self, keys: tuple[int, ...]) -> Held | None:
        return self._held.get(keys)

    def drop(self, keys: tuple[int, ...]) -> None:
        """Forget a bucket's state (its parameters start from zeros next time)."""
        held = self._held.pop(keys, None)
        if held is not None:
            for key in keys:
                self._params.pop(key, None)

    def state_dict(self) -> dict:
        """Each parameter's slices, and each region whole, by key; what is loaded and not yet claimed too."""
        regions = [{"keys": list(keys), **{n: t.clone() for n, t in held.tensors.items()}}
                   for keys, held in self._held.items() if not any(k in self._params for k in keys)]
        params = {key: {n: t.clone() for n, t in slices.items()} for key, slices in self._params.items()}
        return {"params": params | {k: v for k, v in self._loaded.items() if isinstance(k, int)},
                "regions": regions + [{"keys": list(k), **v} for k, v in self._loaded.items() if isinstance(k, tuple)]}

    def load_state_dict(self, state: dict) -> None:
        """Kept until a bucket claims it: its layout (and the device) comes with the bucket."""
        self._held, self._params = {}, {}
        self._loaded = {int(key): {n: t.clone() for n, t in saved.items()} for key, saved in state["params"].items()}
        for region in state.get("regions", []):
            self._loaded[tuple(int(k) for k in region["keys"])] = {n: region[n].clone() for n in self.names}
