"""Healing at a round boundary: each member behind the others (fewer rounds committed, or none at all where the run
starts) receives the state of one that is up to date, over the quorum's new group — point to point, so the ones
already up to date send nothing to each other. The state travels as `torch.save`'s bytes and is read back with
`weights_only=True`: a peer can send tensors and numbers, not code."""

from __future__ import annotations

import io
from collections.abc import Callable

import torch
import torch.distributed as dist


def behind(steps: tuple[int, ...]) -> list[tuple[int, int]]:
    """(receiver, sender) ranks: every member with fewer rounds than the most, each from one of those in turn;
    where nobody has a round yet (the run's start), everyone from rank 0."""
    top = max(steps)
    senders = [r for r, s in enumerate(steps) if s == top] if top > 0 else [0]
    receivers = [r for r, s in enumerate(steps) if r not in senders]
    return [(r, senders[i % len(senders)]) for i, r in enumerate(receivers)]


def heal(steps: tuple[int, ...], rank: int, state: Callable[[], dict], load: Callable[[dict], None]) -> int | None:
    """Send `state()` to the members behind (collective over the default group); `load` it where this member is
    one of them. The rank it came from where it was loaded here, else None."""
    healed_from, sent = None, None
    for receiver, sender in behind(steps):
        if rank == sender:
            sent = sent if sent is not None else _encode(state())
            dist.send(torch.tensor([sent.numel()], dtype=torch.int64), dst=receiver)
            dist.send(sent, dst=receiver)
        elif rank == receiver:
            size = torch.empty(1, dtype=torch.int64)
            dist.recv(size, src=sender)
            data = torch.empty(int(size), dtype=torch.uint8)
            dist.recv(data, src=sender)
            load(torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True))
            healed_from = sender
    return healed_from


def _encode(state: dict) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
