"""Low-rank exchange: PowerSGD (Vogels, Karimireddy and Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization") as a codec of ours, its factors on any dense wire of ours.

Per compressed matrix (`factors.layout`): M = g + e (the error fed back); P = M·Q̂ with Q̂ last step's Q made
orthonormal (warm start; a fresh random Q, the same on every rank, the first time); P summed; P̂ = P made orthonormal;
Q = Mᵀ·P̂ summed; the mean M̂ = P̂·Qᵀ/W is written into the bucket and e = M − M̂ kept. That is one step of subspace
iteration a training step, two sums of (n + m)·r numbers where the gradient has n·m. The uncompressed tensors travel
in P's message, summed exactly, with no error kept.

`lowrank-acp` (alternating) sends one factor a step (ACP-SGD: Zhang, Zhang, Shi, Chu and Li 2023, "Evaluation and
Optimization of Gradient Compression for Distributed Deep Learning"): odd steps P = M·Q̂ with Q̂ kept from the step
before, even steps Q = Mᵀ·P̂; M̂ is the product of the factor just summed and the one kept. One sum a step instead of
two, each half the size on square matrices.

The sums run on the factor wire, one of our dense codecs (`--factor-wire`: fp32, fp16, bf16, or fp8 with each factor's
own range), as nested steps of this bucket's transfer, so they pipeline and overlap backward like any other exchange
on gloo and NCCL alike.

A non-finite gradient on any rank makes the summed P non-finite on every rank: every rank then skips the Q sum,
fills the bucket with NaN and keeps its state (fp16's skipped step).

State per parameter (keyed by the engine's parameter numbers, so DDP's bucket rebuild keeps it): the error and the
factor(s) kept for the warm start, with the phase in alternating mode. PyTorch's hook differs in two ways: it keys
its state by bucket, and for an uncompressed tensor it keeps local − mean as error. We keep none on an fp32 or 16-bit
wire (the tensor was sent exactly, or nearly); on the fp8 wire we keep what it sent less the mean it got back, so
e5m2's rounding is owed, as the factors' is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalesgd import checks
from scalesgd.comm.codecs.base import BucketView, Channel, Codec, Exchange, Piece, Scratch, exchange_steps
from scalesgd.comm.codecs.cast import CastCodec
from scalesgd.comm.codecs.fp8.codec import Fp8Codec
from scalesgd.comm.codecs.fp8.ranges import Fp8Options
from scalesgd.comm.codecs.lowrank.factors import Layout, Matrix, batched, layout, orthogonalize, row_blocks
from scalesgd.comm.wire.pipeline import Steps
from scalesgd.options import option

# numbers of M per block of rows on the CPU: a block's g, e, M and M̂ stay in the core's cache between the passes over
# it (M = g + e, then the product; M̂, then e = M − M̂ and M̂ over M): a fifth less CPU a step on vgg16 (docs/results.md)
ROW_BLOCK = {"cpu": 1 << 17}
FACTOR_WIRES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e5m2}


@dataclass(frozen=True)
class LowrankOptions:
    """The low-rank codecs' options: the rank, the wire their factors travel on, which matrices are factored."""

    rank: int = option(4, "lowrank: rank of each gradient matrix's factors (PowerSGD's r; PyTorch's hook, "
                       "--codec powersgd, at the same rank)", flag="--rank", check=checks.within(1, 1 << 16))
    factor_wire: str = option("fp32", "lowrank: the wire the factors and the uncompressed tensors travel on (fp8: "
                              "e5m2 with each factor's own range and fp8's guardrails, its --fp8-* options, the "
                              "uncompressed tensors' rounding kept as error)",
                              flag="--factor-wire", choices=tuple(FACTOR_WIRES), own=True)
    min_rate: float = option(2.0, "lowrank: a matrix is factored only when its factors are this many times smaller "
                             "(PyTorch's min_compression_rate; its hook, --codec powersgd, takes it too)",
                             check=checks.within(1, 1e6))


class _State:
    """One parameter's error feedback and the factors kept for the next step."""

    def __init__(self, numel: int, matrix: Matrix, device: torch.device, dtype: torch.dtype, seed: int):
        self.error = torch.zeros(numel, dtype=dtype, device=device)
        # the first Q: random, drawn from (seed, parameter) alone, so every rank and a resumed run draw the same
        gen = torch.Generator().manual_seed(hash((seed, matrix.key)) & (2 ** 62 - 1))
        q = torch.randn(matrix.cols, matrix.rank, generator=gen, dtype=torch.float32)
        self.qt = q.t().contiguous().to(device, dtype)  # kept transposed, as the Q buffer holds it
        self.p = torch.zeros(matrix.rows, matrix.rank, dtype=dtype, device=device)
        self.phase = 0  # alternating: 0 computes P next, 1 computes Q
        self.steps = 0  # steps exchanged in this run (not saved: it only times the counters' measurements)

    def state_dict(self) -> dict:
        return {"error": self.error.clone(), "q": self.qt.t().contiguous(), "p": self.p.clone(), "phase": self.phase}

    def load(self, saved: dict) -> None:
        self.error.copy_(saved["error"])
        self.qt.copy_(saved["q"].t())
        self.p.copy_(saved["p"])
        self.phase = int(saved["phase"])


class LowrankCodec(Codec):
    """Each gradient matrix as two rank-r factors with error feedback; small tensors uncompressed beside them."""

    keeps_gradients = True  # the error carries gradients across steps
    measures_every = 16  # ‖M‖ and ‖e‖ on one step in this many: two more passes over every matrix otherwise

    def __init__(self, options: LowrankOptions = LowrankOptions(), seed: int = 0, alternate: bool = False,
                 fp8: Fp8Options = Fp8Options()):
        self.name, self.options, self.seed = "lowrank-acp" if alternate else "lowrank", options, seed
        self.alternate = alternate
        # fp8 rounds by up to 2⁻³ of a value: the uncompressed tensors keep theirs as error, as the factors' is kept
        self.keeps_rounding = options.factor_wire == "fp8"
        if self.keeps_rounding:  # the factors are not gradients of weights: e5m2 of the values themselves
            self.wire = Fp8Codec("lowrank_fp8", relative=False, two_stage=False, options=fp8, seed=seed)
        else:
            self.wire = CastCodec(f"lowrank_{options.factor_wire}", FACTOR_WIRES[options.factor_wire])
        self._rounding: dict[int, torch.Tensor] = {}  # parameter number → its rounding owed (sent uncompressed)
        self._states: dict[int, _State] = {}  # parameter number → its state
        self._loaded: dict[int, dict] = {}  # saved states not yet claimed by a bucket (their shapes come with it)
        self._norms: list[torch.Tensor] = []  # each bucket's (‖M‖, ‖e‖) per matrix since the counters were read
        self._error_ratio: float | None = None  # ‖e‖/‖M‖ at the last step measured

    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        o = self.options
        shapes = tuple(tuple(p.shape) for p in bucket.params)
        plan = scratch.memo("layout", (bucket.keys, shapes, flat.numel(), o.rank, o.min_rate),
                            lambda: layout(bucket.keys, bucket.offsets, shapes, flat.numel(), o.rank, o.min_rate))
        return LowrankExchange(self, flat, bucket, plan, channel, scratch)

    def state_of(self, matrix: Matrix, like: torch.Tensor) -> _State:
        """The matrix's state: kept, loaded from a checkpoint, or new."""
        st = self._states.get(matrix.key)
        if st is None or st.error.numel() != matrix.numel or st.qt.shape != (matrix.rank, matrix.cols):
            st = self._states[matrix.key] = _State(matrix.numel, matrix, like.device, like.dtype, self.seed)
            saved = self._loaded.pop(matrix.key, None)
            if saved is not None and saved["error"].numel() == matrix.numel:
                st.load(saved)
        return st

    def count(self, norms: torch.Tensor) -> None:
        """One bucket's (‖M‖, ‖e‖) per matrix, kept on the device until the counters are read (no step waits)."""
        self._norms.append(norms)

    def counters(self) -> dict[str, float]:
        """The wire's counters, and ‖e‖/‖M‖ over the matrices at the last step measured: what the factors left
        behind."""
        out = self.wire.counters()
        if self._norms:
            gradient_sq, error_sq = torch.cat(self._norms).double().square().sum(0).tolist()
            self._norms = []
            if gradient_sq:
                self._error_ratio = math.sqrt(error_sq / gradient_sq)
        if self._error_ratio is not None:
            out["lowrank_error_ratio"] = self._error_ratio
        return out

    def rounding_of(self, key: int, size: int, like: torch.Tensor) -> torch.Tensor:
        """The rounding an uncompressed parameter owes (zeros at first)."""
        owed = self._rounding.get(key)
        if owed is None or owed.numel() != size:
            owed = self._rounding[key] = torch.zeros(size, dtype=like.dtype, device=like.device)
        return owed

    def save_bucket(self, bucket: BucketView, flat: torch.Tensor):
        return ({key: self._states[key].state_dict() for key in bucket.keys if key in self._states},
                {key: self._rounding[key].clone() for key in bucket.keys if key in self._rounding},
                self.wire.state_dict())

    def restore_bucket(self, bucket: BucketView, saved) -> None:
        """The errors, factors and the factor wire's ranges as before the step; a parameter's first step leaves no
        state."""
        states, rounding, wire = saved
        self.wire.load_state_dict(wire)
        for key in bucket.keys:
            if key in states:
                self._states[key].load(states[key])
            else:
                self._states.pop(key, None)
            if key in rounding:
                self._rounding[key].copy_(rounding[key])
            else:
                self._rounding.pop(key, None)

    def pop_notices(self) -> list[tuple[torch.Tensor, str]]:
        return self.wire.pop_notices()

    def state_dict(self) -> dict:
        return {"params": {key: st.state_dict() for key, st in self._states.items()} | dict(self._loaded),
                "rounding": {key: owed.clone() for key, owed in self._rounding.items()},
                "wire": self.wire.state_dict()}

    def shared_state_dict(self) -> dict:
        """The factors every rank holds alike (Q, P, the phase) and the wire's state; each rank's error feedback and
        rounding owed are its own (a joiner's start at zero)."""
        state = self.state_dict()
        return {**state, "rounding": {},
                "params": {key: {**saved, "error": torch.zeros_like(saved["error"])}
                           for key, saved in state["params"].items()}}

    def load_state_dict(self, state: dict) -> None:
        self._states = {}
        self._loaded = {int(key): saved for key, saved in state["params"].items()}
        self._rounding = {int(key): owed.clone() for key, owed in state.get("rounding", {}).items()}
        self.wire.load_state_dict(state.get("wire", {}))


class LowrankExchange(Exchange):
    """One bucket's step, one piece: P (and the uncompressed tensors) summed, then Q; or one of them, alternating."""

    def __init__(self, codec: LowrankCodec, flat: torch.Tensor, bucket: BucketView, plan: Layout, channel: Channel,
                 scratch: Scratch):
        self.codec, self.flat, self.plan, self.channel, self.scratch = codec, flat, plan, channel, scratch
        dtype, device = torch.promote_types(flat.dtype, torch.float32), flat.device
        self.work = flat if flat.dtype == dtype else scratch.tensor("work", flat.numel(), dtype, device)
        self.states = [codec.state_of(m, self.work) for m in plan.matrices]
        self.alternate = codec.alternate
        # what this step sends: P, or (alternating) whichever factor this step computes; the uncompressed after it
        phases = {st.phase for st in self.states}
        self.phase = phases.pop() if len(phases) == 1 else 0  # a bucket's parameters step together
        self.sends_q = self.alternate and self.phase == 1
        factors = plan.q_numel if self.sends_q else plan.p_numel
        self.message = scratch.tensor("message_q" if self.sends_q else "message", factors + plan.dense_numel, dtype,
                                      device)
        self.factors = self.message[:factors]
        self.p = self.factors if not self.sends_q else scratch.tensor("p", plan.p_numel, dtype, device)
        self.q = scratch.tensor("q", plan.q_numel, dtype, device) if not self.sends_q else self.factors
        self.bounds = [(0, flat.numel())]
        self.flagged = False
        self.block = ROW_BLOCK.get(device.type)  # None: whole matrices (one kernel each on an accelerator)
        if self.block is not None:  # one block of M̂, at most `block` numbers
            largest = max((min(m.numel, self.block) for m in plan.matrices), default=0)
            self.product = scratch.tensor("product", largest, dtype, device)

    def matrix(self, m: Matrix) -> torch.Tensor:
        return self.work[m.start:m.start + m.numel].view(m.rows, m.cols)

    def encode(self, piece: Piece) -> None:
        """The factor kept made orthonormal; M = g + e and the factor this step sends from it, a block of rows at a
        time; the uncompressed tensors."""
        if self.work is not self.flat:
            self.work.copy_(self.flat)
        kept, sent = ("p", "q") if self.sends_q else ("q", "p")
        for m, st in zip(self.plan.matrices, self.states):
            if self.sends_q:
                m.p(self.p).copy_(st.p)
            else:
                m.qt(self.q).copy_(st.qt)
        for group in self.plan.groups():
            orthogonalize(batched(getattr(self, kept), group, kept))
        for m, st in zip(self.plan.matrices, self.states):
            self._multiply(m, sent, st.error.view(m.rows, m.cols))
        if self.codec.keeps_rounding:
            for key, start, size, _ in self.plan.uncompressed:
                self.work[start:start + size].add_(self.codec.rounding_of(key, size, self.work))
        for bucket, message in self._uncompressed():
            message.copy_(bucket)

    def _uncompressed(self):
        """(the bucket's run, its place in the message) for each run sent uncompressed after the factors."""
        at = self.factors.numel()
        for start, size in self.plan.dense:
            yield self.work[start:start + size], self.message[at:at + size]
            at += size

    def _multiply(self, m: Matrix, into: str, error: torch.Tensor | None = None) -> None:
        """P = M·Q̂ (`into` "p") or Qᵀ = P̂ᵀ·M ("q") for one matrix, reading M along its rows a block at a time;
        with `error`, M = g + e first, block by block, so each block is still in cache for the product."""
        p, qt, matrix = m.p(self.p), m.qt(self.q), self.matrix(m)
        for a, b in row_blocks(m.rows, m.cols, self.block):
            rows = matrix[a:b]
            if error is not None:
                rows.add_(error[a:b])
            if into == "p":
                torch.mm(rows, qt.t(), out=p[a:b])
            elif a == 0:
                torch.mm(p[a:b].t(), rows, out=qt)
            else:
                qt.addmm_(p[a:b].t(), rows)

    def transfer(self, piece: Piece) -> Steps:
        """The message's mean on the factor wire; then, unless alternating, P̂ and Q's mean."""
        sent = yield from self._mean(self.message, "message", piece)
        self.flagged = not bool(torch.isfinite(self.message).all())  # the same sum on every rank: the same verdict
        if self.flagged or self.alternate or not self.plan.matrices:
            return sent
        for group in self.plan.groups():
            orthogonalize(batched(self.p, group, "p"))
        for m in self.plan.matrices:
            self._multiply(m, "q")
        sent += yield from self._mean(self.q, "q", piece)
        self.flagged = not bool(torch.isfinite(self.q).all())
        return sent

    def _mean(self, tensor: torch.Tensor, name: str, piece: Piece) -> Steps:
        """`tensor`'s mean over ranks on the factor wire, its pieces one after another under this piece's tag."""
        inner_scratch = self.scratch.memo(f"wire:{name}", True, Scratch)
        view = self.scratch.memo(f"view:{name}", (id(self.plan), self.sends_q), lambda: self._segments(name, tensor))
        return (yield from exchange_steps(self.codec.wire.start(tensor, view, self.channel, inner_scratch), piece.tag))

    def _segments(self, name: str, tensor: torch.Tensor) -> BucketView:
        """The message as the tensors a wire with per-tensor state sees (fp8's ranges): each matrix's factor, keyed
        by its parameter and which factor it is, then each uncompressed run, keyed by its place in the bucket."""
        q = name == "q" or self.sends_q
        sizes = [(2 * m.key + q, (m.cols if q else m.rows) * m.rank) for m in self.plan.matrices]
        if name == "message":
            sizes += [(-1 - start, size) for start, size in self.plan.dense]
        offsets = [sum(n for _, n in sizes[:i]) for i in range(len(sizes))]
        stand_ins = [torch.empty(n, device="meta") for _, n in sizes]  # sizes only: nothing is read from them
        return BucketView(-1, stand_ins, offsets, tensor.numel(), tuple(key for key, _ in sizes))

    def _reconstruct(self, m: Matrix, error: torch.Tensor) -> None:
        """e = M − M̂ and M̂ = P̂·Qᵀ over M for one matrix: on the CPU a block of rows at a time, M̂'s block into a
        scratch the size of the core's cache, so M, M̂ and e each cross memory once; elsewhere in three whole-matrix
        kernels."""
        p, qt, matrix = m.p(self.p), m.qt(self.q), self.matrix(m)
        if self.block is None:
            error.copy_(matrix)
            torch.mm(p, qt, out=matrix)
            error.sub_(matrix)
            return
        for a, b in row_blocks(m.rows, m.cols, self.block):
            rows, product = matrix[a:b], self.product[:(b - a) * m.cols].view(b - a, m.cols)
            torch.mm(p[a:b], qt, out=product)
            torch.sub(rows, product, out=error[a:b])
            rows.copy_(product)

    def decode(self, piece: Piece) -> None:
        """M̂ = P̂·Qᵀ into the bucket and e = M − M̂ kept (the factors' means carry the 1/W), the uncompressed means
        beside; NaN everywhere when some rank's gradient was not finite."""
        if self.flagged:
            self.flat.fill_(math.nan)
            return
        norms = []  # ‖M‖ and ‖e‖ of each matrix, on the device: read when the counters are
        for m, st in zip(self.plan.matrices, self.states):
            p, qt = m.p(self.p), m.qt(self.q)
            matrix, error = self.matrix(m), st.error.view(m.rows, m.cols)
            measured = st.steps % self.codec.measures_every == 0
            st.steps += 1
            gradient = torch.linalg.vector_norm(matrix) if measured else None
            self._reconstruct(m, error)
            if measured:
                norms.append(torch.stack([gradient, torch.linalg.vector_norm(error)]))
            st.qt.copy_(qt)  # the mean Q (made orthonormal next step), or alternating, the factor kept or summed
            if self.alternate:
                st.p.copy_(p)
                st.phase = 1 - self.phase
        if self.codec.keeps_rounding:  # what each uncompressed parameter sent less the mean it got back
            sent = self.message[self.factors.numel():]
            for key, start, size, at in self.plan.uncompressed:
                torch.sub(self.work[start:start + size], sent[at:at + size],
                          out=self.codec.rounding_of(key, size, self.work))
        for bucket, message in self._uncompressed():
            bucket.copy_(message)
        if self.work is not self.flat:
            self.flat.copy_(self.work)
        if norms:
            self.codec.count(torch.stack(norms))
