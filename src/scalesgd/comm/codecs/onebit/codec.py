"""1-bit Adam's exchange (Tang, Gan, Rajbhandari, Lian, Zhang, Liu and He 2021, "1-bit Adam: Communication
Efficient Large-Scale Training with Adam's Convergence Speed"): once Adam's variance is frozen, what travels is
the momentum, each element's sign as one bit, with error feedback on both sides of the sum.

Warm-up: the engine's dense-first steps (`compress_after`) exchange the gradient in fp32; `after_dense` folds each
mean ḡ into the momentum, m ← β1·m + (1−β1)·ḡ, so at the freeze m is Adam's exp_avg. After it, per bucket:
m ← β1·m + (1−β1)·g (this rank's gradient); c = m + e_w; the bucket is cut into one part per rank; each part is
sent as signs and a scale ‖·‖₂/√n per `chunk` elements (`signs.Message`), e_w ← c − what was sent. Rank j, the
"server" of part j, receives every rank's compressed part j (an all-to-all), averages them, adds its error e_s,
compresses again, e_s ← s − what it sends, and sends that to every rank (an all-gather). Every rank decompresses
the same m̄, keeps m ← m̄ and writes m̄ into the bucket: the bucket's result is the averaged MOMENTUM, which
`scalesgd.optim.onebit_adam.OneBitAdam` takes as its exp_avg.

Both phases are pairwise sends and receives posted as steps (`wire.collectives.post`, both directions at once),
W − 1 each, rather than gloo's `all_to_all_single` and `all_gather`, which work but carry one direction at a time
(`wire.collectives`) and cannot interleave with other pieces as steps do. A rank sends 2·(W−1)/W bits per
element (plus a 4-byte scale per chunk and a flag byte per message), where fp32's ring allreduce sends
2·(W−1)/W·4 bytes: 32× fewer. The exchange is one piece: at 1/32 of fp32's bytes, the engine's 4 MiB pieces
would hold a 32M-element bucket.

A rank whose momentum is not finite (fp16 overflow) raises its messages' flag; every server passes the flag on,
so every rank writes NaN into the bucket and no state (m, e_w, e_s) changes that step.

State: m and e_w belong to parameters (keyed by the engine's parameter numbers, so they survive any regrouping,
DDP's bucket rebuild included); e_s belongs to this rank's part of a bucket, keyed by the bucket's parameter
numbers and the number of ranks: a resume with the same buckets restores it exactly, another grouping starts it
at zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd import checks
from scalesgd.comm.codecs.base import BucketView, Channel, Codec, Exchange, Piece, Scratch
from scalesgd.comm.codecs.onebit.signs import Message
from scalesgd.comm.codecs.state import FlatState, keys_of
from scalesgd.comm.wire.collectives import chunk_bounds, post
from scalesgd.comm.wire.pipeline import Steps
from scalesgd.options import option


def _whole_bytes(value) -> str | None:
    return None if value >= 8 and value % 8 == 0 else "must be a multiple of 8, at least 8 (whole bytes of signs)"


@dataclass(frozen=True)
class OnebitOptions:
    """1-bit Adam's exchange: the momentum's β1 (the optimizer's) and the elements sharing one scale.

    A chunk of 2**14 costs 4 bytes of scale per 2 KiB of signs (0.2 % more bytes) and gives a small layer a scale
    of its own rather than its bucket's, where one scale per part (the paper's) lets a large layer's norm set a
    small one's magnitude, leaving the error feedback more to carry."""

    beta1: float = option(0.9, "onebit: the momentum's β1; must equal the optimizer's", check=checks.within(
        0, 1, high_open=True))
    chunk: int = option(1 << 14, "onebit: elements per scale ‖x‖₂/√n", check=_whole_bytes)


class OnebitCodec(Codec):
    """The momentum as signs and scales, compressed twice with error feedback (worker and server)."""

    keeps_gradients = True  # the momentum and both errors carry gradients across steps

    def __init__(self, beta1: float = 0.9, chunk: int = 1 << 14):
        self.name, self.beta1, self.chunk = "onebit", beta1, chunk
        self._moments = FlatState(("m", "error"), torch.float32)  # each parameter's m and e_w, flat by bucket
        self._server: dict[tuple, torch.Tensor] = {}  # (parameter keys, ranks) → this rank's e_s of that bucket

    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        return OnebitExchange(self, flat, bucket, channel, scratch)

    def after_dense(self, out: torch.Tensor, bucket: BucketView) -> None:
        """A warm-up step's mean ḡ into the momentum (unless it is not finite: the optimizer skips that step)."""
        m = self.moments(bucket, out)["m"]
        if bool(torch.isfinite(out).all()):
            m.lerp_(out.to(m.dtype), 1 - self.beta1)

    def moments(self, bucket: BucketView, like: torch.Tensor) -> dict[str, torch.Tensor]:
        """The bucket's m and e_w, flat; a bucket of other parameters than before takes each parameter's over (and
        the server errors of buckets that held them are dropped)."""
        held = self._moments.of(bucket, like)
        if held.new:
            keys = set(held.keys)
            self._server = {k: v for k, v in self._server.items() if k[0] == held.keys or not set(k[0]) & keys}
        return held.tensors

    def server_error(self, bucket: BucketView, ranks: int, like: torch.Tensor, length: int) -> torch.Tensor:
        """This rank's e_s of the bucket's part it serves (`length` elements), kept under the bucket's parameter keys
        and the number of ranks: zeros for a bucket or a group it has not served."""
        key = (keys_of(bucket), ranks)
        error = self._server.get(key)
        if error is None or error.numel() != length:
            dtype = torch.promote_types(like.dtype, torch.float32)
            error = self._server[key] = torch.zeros(length, dtype=dtype, device=like.device)
        elif error.device != like.device:
            error = self._server[key] = error.to(like.device)
        return error

    def save_bucket(self, bucket: BucketView, flat: torch.Tensor):
        """The bucket's m and e_w as the coming step finds them (its layout made first), and every e_s of the buckets
        its parameters were in."""
        keys = set(keys_of(bucket))
        server = {k: e.clone() for k, e in self._server.items() if set(k[0]) & keys}
        return {name: t.clone() for name, t in self.moments(bucket, flat).items()}, server

    def restore_bucket(self, bucket: BucketView, saved) -> None:
        moments, server = saved
        held = self.moments(bucket, next(iter(moments.values())))
        for name, t in moments.items():
            held[name].copy_(t)
        keys = set(keys_of(bucket))
        self._server = {k: e for k, e in self._server.items() if not set(k[0]) & keys} | server

    def state_dict(self) -> dict:
        return {"moments": self._moments.state_dict(),
                "server": [{"keys": list(keys), "ranks": ranks, "error": e.clone()}
                           for (keys, ranks), e in sorted(self._server.items(), key=lambda item: item[0])]}

    def load_state_dict(self, state: dict) -> None:
        if "params" in state:  # saved before the moments were kept flat: each parameter's m and e_w
            state = {"moments": {"params": {key: {"m": saved["m"], "error": saved["error"]}
                                            for key, saved in state["params"].items()}}, "server": state["server"]}
        self._moments.load_state_dict(state["moments"])
        self._server = {(tuple(int(k) for k in saved["keys"]), int(saved["ranks"])): saved["error"].clone()
                        for saved in state["server"]}


class OnebitExchange(Exchange):
    """One bucket's step: compress the parts (encode), all-to-all, the server's average and second compression,
    all-gather (transfer), decompress (decode), keep the new state unless some rank was not finite (finish)."""

    def __init__(self, codec: OnebitCodec, flat: torch.Tensor, bucket: BucketView, channel: Channel,
                 scratch: Scratch):
        self.codec, self.flat, self.group, self.ranks = codec, flat, channel.group, channel.world_size
        self.rank = dist.get_rank(channel.group) if self.ranks > 1 else 0
        self.moments = codec.moments(bucket, flat)
        dtype, device, n = self.moments["m"].dtype, flat.device, flat.numel()
        self.parts = chunk_bounds(n, self.ranks)
        self.messages = [Message(b - a, codec.chunk) for a, b in self.parts]
        self.at = [0]
        for message in self.messages:
            self.at.append(self.at[-1] + message.size)
        mine = self.messages[self.rank]
        self.server_error = codec.server_error(bucket, self.ranks, flat, mine.length)
        self.send = scratch.tensor("send", self.at[-1], torch.uint8, device)  # every part, compressed by this rank
        self.gathered = scratch.tensor("gathered", self.at[-1], torch.uint8, device)  # every part, by its server
        self.received = scratch.tensor("received", self.ranks * mine.size, torch.uint8, device)  # this rank's part
        self.c = scratch.tensor("c", n, dtype, device)  # m + e_w, then the new e_w
        self.s = scratch.tensor("s", mine.length, dtype, device)  # the server's sum, then its new e_s
        self.out = flat if flat.dtype == dtype else scratch.tensor("out", n, dtype, device)
        self.bounds = [(0, n)]
        self.flagged = False

    def _sent(self, j: int) -> torch.Tensor:
        return self.send[self.at[j]:self.at[j + 1]]

    def _from_server(self, j: int) -> torch.Tensor:
        return self.send[self.at[j]:self.at[j + 1]] if j == self.rank else self.gathered[self.at[j]:self.at[j + 1]]

    def _from_rank(self, k: int) -> torch.Tensor:
        size = self.messages[self.rank].size
        return self._sent(self.rank) if k == self.rank else self.received[k * size:(k + 1) * size]

    def encode(self, piece: Piece) -> None:
        """c = β1·m + (1−β1)·g + e_w; each part compressed into `send`; c becomes the new e_w."""
        torch.lerp(self.moments["m"], self.flat.to(self.c.dtype), 1 - self.codec.beta1, out=self.c)
        self.c.add_(self.moments["error"])
        scales = [message.write(self.c[a:b], self._sent(j))
                  for j, ((a, b), message) in enumerate(zip(self.parts, self.messages))]
        bad = bool(not torch.isfinite(torch.cat(scales)).all())
        for j, ((a, b), message) in enumerate(zip(self.parts, self.messages)):
            message.flag(self._sent(j)).fill_(bad)
            message.read(self._sent(j), self.out[a:b])  # what the server will decompress
        self.c.sub_(self.out)

    def transfer(self, piece: Piece) -> Steps:
        """All-to-all of the parts, the server's step on this rank's part, all-gather of the servers' parts."""
        r, ranks, mine = self.rank, self.ranks, self.messages[self.rank]
        sent = 0
        for shift in range(1, ranks):
            dst, src = (r + shift) % ranks, (r - shift) % ranks
            works, nbytes = post(self.group, self._sent(dst), dst, self._from_rank(src), src, piece.tag)
            yield works
            sent += nbytes
        self.flagged = any(bool(mine.flag(self._from_rank(k)).item()) for k in range(ranks))
        own = self.out[self.parts[r][0]:self.parts[r][1]]
        if not self.flagged:
            self.s.zero_()
            for k in range(ranks):
                mine.read(self._from_rank(k), own)
                self.s.add_(own)
            self.s.div_(ranks).add_(self.server_error)
            mine.write(self.s, self._sent(r))
            mine.read(self._sent(r), own)
            self.s.sub_(own)
        mine.flag(self._sent(r)).fill_(self.flagged)
        for shift in range(1, ranks):
            dst, src = (r + shift) % ranks, (r - shift) % ranks
            works, nbytes = post(self.group, self._sent(r), dst, self._from_server(src), src, piece.tag)
            yield works
            sent += nbytes
        return sent

    def decode(self, piece: Piece) -> None:
        """Every server's part of m̄ into the bucket, or NaN everywhere when some rank's values were not finite."""
        for j, ((a, b), message) in enumerate(zip(self.parts, self.messages)):
            self.flagged |= bool(message.flag(self._from_server(j)).item())
            if j != self.rank and not self.flagged:
                message.read(self._from_server(j), self.out[a:b])
        if self.flagged:
            self.flat.fill_(math.nan)
        elif self.out is not self.flat:
            self.flat.copy_(self.out)

    def finish(self) -> None:
        """m ← m̄, e_w and e_s their new values (a step that is not finite and skipped is undone by the engine)."""
        self.moments["m"].copy_(self.out)
        self.moments["error"].copy_(self.c)
        self.server_error.copy_(self.s)
