"""Healing at a round boundary: each member behind the others (fewer rounds committed, or none at all where the run
starts) receives the state of one that is up to date, over the quorum's new group — point to point, so the ones
already up to date send nothing to each other. The state travels as `torch.save`'s bytes and is read back with
`weights_only=True`: a peer can send tensors and numbers, not code.

`heal` sends it all before the round goes on (every member waits while it crosses); `heal_behind` sends only the
counters and the codec's shared state then (kB), and the global parameters and outer state (MB: ~6 s at 10 Mbit/s)
on a thread while the rounds go on without waiting for them — once the round's own exchange is over, so that the
state does not share the sender's link with the reduce every member waits on (on 4 testbed nodes at 10 Mbit/s, a
round's reduce took 2.3 s instead of 0.8 beside it)."""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd.elastic.threads import DaemonThreads

_THREADS = DaemonThreads("scalesgd-heal")  # a body crossing: abandoned where its peer froze
HEAL_TAG = 1 << 20  # the state's bytes behind a round: apart from the tags its exchange's pieces use beside them


def behind(steps: tuple[int, ...]) -> list[tuple[int, int]]:
    """(receiver, sender) ranks: every member with fewer rounds than the most, each from one of those in turn;
    where nobody has a round yet (the run's start), everyone from rank 0."""
    top = max(steps)
    senders = [r for r, s in enumerate(steps) if s == top] if top > 0 else [0]
    receivers = [r for r, s in enumerate(steps) if r not in senders]
    return [(r, senders[i % len(senders)]) for i, r in enumerate(receivers)]


def heal(steps: tuple[int, ...], rank: int, state: Callable[[], dict], load: Callable[[dict], None],
         compare: bool = False) -> int | None:
    """Send `state()` to the members behind (collective over the default group); `load` it where this member is
    one of them. The rank it came from where it was loaded here, else None. `compare`: every member holds a state of
    its own (the run's start, each model built alike from the run's random state), so the members first compare
    hashes of what they would send, and only one whose state differs from its sender's receives it (at 10 Mbit/s on
    4 nodes, the start's heal took 8 s)."""
    healed_from, sent = None, None
    pairs = behind(steps)
    if compare and pairs:
        sent = _encode(state())
        said: list[str | None] = [None] * len(steps)
        dist.all_gather_object(said, hashlib.sha256(sent.numpy().tobytes()).hexdigest())
        pairs = [(receiver, sender) for receiver, sender in pairs if said[receiver] != said[sender]]
    for receiver, sender in pairs:
        if rank == sender:
            sent = sent if sent is not None else _encode(state())
            dist.send(torch.tensor([sent.numel()], dtype=torch.int64), dst=receiver)
            dist.send(sent, dst=receiver)
        elif rank == receiver:
            size = torch.empty(1, dtype=torch.int64)
            dist.recv(size, src=sender)
            data = torch.empty(int(size), dtype=torch.uint8)
            dist.recv(data, src=sender)
            load(_decode(data))
            healed_from = sender
    return healed_from


@dataclass
class Healing:
    """What a member behind received at the boundary (`header`), the rest still crossing (`body`: a Future of its
    dict), and the rank it comes from."""

    header: dict
    body: Future
    source: int


def heal_behind(steps: tuple[int, ...], rank: int, header: Callable[[], dict], body: Callable[[], dict],
                after: threading.Event | None = None) -> Healing | None:
    """As `heal`, with `header()` sent now and `body()` (encoded now: what it held at the boundary) on a daemon
    thread under `HEAL_TAG`, once `after` is set (the round's exchange over). Where this member is behind, what it
    received; else None (a send that fails, its peer gone, is its receiver's to notice)."""
    healing, sent = None, None
    for receiver, sender in behind(steps):
        if rank == sender:
            sent = sent if sent is not None else (_encode(header()), _encode(body()))
            head, rest = sent
            group = dist.group.WORLD  # this quorum's: the thread must not post into the next one's
            dist.send(torch.tensor([head.numel(), rest.numel()], dtype=torch.int64), dst=receiver)
            dist.send(head, dst=receiver)
            _THREADS.submit(lambda rest=rest, receiver=receiver, group=group: _send_after(after, rest, receiver, group))
        elif rank == receiver:
            sizes = torch.empty(2, dtype=torch.int64)
            dist.recv(sizes, src=sender)
            head = torch.empty(int(sizes[0]), dtype=torch.uint8)
            dist.recv(head, src=sender)
            rest, group = torch.empty(int(sizes[1]), dtype=torch.uint8), dist.group.WORLD
            healing = Healing(_decode(head), _THREADS.submit(
                lambda: (dist.recv(rest, src=sender, group=group, tag=HEAL_TAG), _decode(rest))[1]), sender)
    return healing


def _send_after(after: threading.Event | None, data: torch.Tensor, receiver: int, group) -> None:
    if after is not None:
        after.wait()
    dist.send(data, dst=receiver, group=group, tag=HEAL_TAG)


def _encode(state: dict) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _decode(data: torch.Tensor) -> dict:
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
