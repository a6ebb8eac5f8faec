"""Every scalesgd codec as DDP's comm hook under what users turn on: no_sync accumulation, bf16 autocast,
static_graph, gradient_as_bucket_view, find_unused_parameters with a branch unused on even steps, tied weights,
a torch.compile'd model. Each cell trains (the loss falls, every rank holds the same mean, the gradients are what
the codec promises, its bytes are counted) or is refused with one clear ValueError line; docs/hooks.md shows the
matrix. Two gloo workers are spawned once and run every cell; a hang fails the test instead of stalling the suite."""

import gc
import os
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import (CODECS, CastCodec, CodecSettings, Fp8Codec, LowrankCodec, LowrankOptions, TopkOptions,
                                  make_codec)
from scalesgd.comm.codecs.onebit import OnebitCodec
from scalesgd.comm.engine.ddp_hook import CodecHookState
from tests.spawn_util import PRELOAD, _entry, _free_port

WORLD = 2
STEPS = 4
LR = 0.5
VOCAB, DIM, BATCH = 16, 8, 8
CAP_MB = 200 / 2 ** 20  # 200 bytes: the tiny model in several buckets, which DDP rebuilds after the first step
TIMEOUT_S = 150  # the whole matrix takes ~13 s; past this the workers are killed and the test fails as a hang

# Every registered codec with a scalesgd implementation, ablations included (fp8-direct and fp8-flat take other
# paths than fp8: the gradient itself, one flat ring); powersgd is PyTorch's own hook, not ours.
MATRIX_CODECS = [name for name, entry in CODECS.items() if entry.build is not None]
COMBOS = ["plain", "no_sync", "autocast", "static_graph", "bucket_view", "unused", "tied", "compile"]
# What is refused, with the words its one line must hold: (row, codecs) → message.
REFUSED = {
    ("bf16_params", "sparse"): "keeps float32 residuals",
    ("sparse_grad", "all"): "exchanges dense gradients",
    ("skip_unused", "topk-global"): "skip_all_reduce_unused_params=True is not supported",
}
# The codec itself from the first step (no dense start, no density warm-up): a few steps must exercise it; rank 1 so
# that the tiny model's matrices are worth factoring.
SETTINGS = CodecSettings(TopkOptions(density_warmup=0), LowrankOptions(rank=1))
# dynamo + AOTAutograd: the compiled forward and backward graphs DDP's gradient hooks meet, without inductor's C++
# code generation, which costs ~11 s per process cold here (most of this test's budget) and changes only kernels.
COMPILE_BACKEND = "aot_eager"


class Tiny(nn.Module):
    """Tokens → embedding mean → tanh layer → logits. `branch` is used only while `use_branch`; `tied`: the output
    layer shares the embedding's weight (one parameter used twice)."""

    def __init__(self, branch=False, tied=False, sparse=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, sparse=sparse)
        self.hidden = nn.Linear(DIM, DIM)
        self.branch = nn.Linear(DIM, DIM) if branch else None
        self.out = nn.Linear(DIM, VOCAB)
        if tied:
            self.out.weight = self.emb.weight
        self.use_branch = False

    def forward(self, x):
        h = torch.tanh(self.hidden(self.emb(x).mean(1)))
        if self.branch is not None and self.use_branch:
            h = h + self.branch(h)
        return self.out(h)


def fresh_model(combo):
    torch.manual_seed(0)
    model = Tiny(branch=combo == "unused", tied=combo == "tied", sparse=combo == "sparse_grad")
    return model.to(torch.bfloat16) if combo == "bf16_params" else model


def batch(rank):
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, VOCAB, (BATCH, 4), generator=g)
    return x, (x.sum(1) * 7) % VOCAB


def loss_of(module, x, y, combo):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=combo == "autocast"):
        return nn.functional.cross_entropy(module(x).float(), y)


def grads_of(model):
    return torch.cat([p.grad.reshape(-1).float() if p.grad is not None else torch.zeros(p.numel())
                      for p in model.parameters()])


def identity_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """This rank's own gradients, not exchanged: what bounds the wire's rounding."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def make_ddp(module, combo):
    return DistributedDataParallel(module, bucket_cap_mb=None if combo == "compile" else CAP_MB,  # dynamo's DDP
                                   static_graph=combo == "static_graph",  # optimizer wants the first-bucket cap
                                   gradient_as_bucket_view=combo == "bucket_view",
                                   find_unused_parameters=combo == "unused",
                                   skip_all_reduce_unused_params=combo == "skip_unused")


def run_cell(codec, combo, rank, compile_model):
    """STEPS steps of SGD on the tiny model under `combo` with `codec` as DDP's hook (None: DDP's own allreduce,
    "local": no exchange); each step's gradients and bytes, and the loss before and after."""
    model = fresh_model(combo)
    x, y = batch(rank)
    with torch.no_grad():
        before = float(loss_of(model, x, y, combo))
    ddp = make_ddp(compile_model(model) if combo == "compile" else model, combo)
    state = None
    if codec == "local":
        ddp.register_comm_hook(None, identity_hook)
    elif codec is not None:
        state = CodecHookState(codec, settings=SETTINGS, model=model, compress_after=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads, sent = [], []
    try:
        if state is not None:
            state.register(ddp)
        for step in range(STEPS):
            model.use_branch = step % 2 == 1
            optimizer.zero_grad()
            if combo == "no_sync":  # 2 micro-batches, exchanged once
                with ddp.no_sync():
                    loss_of(ddp, x[:BATCH // 2], y[:BATCH // 2], combo).backward()
                loss_of(ddp, x[BATCH // 2:], y[BATCH // 2:], combo).backward()
            else:
                loss_of(ddp, x, y, combo).backward()
            grads.append(grads_of(model))
            sent.append(state.bytes_sent if state is not None else 0)
            optimizer.step()
    finally:
        if state is not None:
            state.close()
    model.use_branch = False
    with torch.no_grad():
        after = float(loss_of(model, x, y, combo))
    return {"grads": grads, "before": before, "after": after, "bytes": [b - a for a, b in zip([0] + sent, sent)]}


def recovery(rank):
    """topk-global holds DDP's buckets until the last: a backward that fails after handing over the first ones,
    then a new DDP with the same state, gives what a state that never saw the failure gives."""
    model = fresh_model("plain")
    x, y = batch(rank)

    def backward(ddp, fail=False):
        failing = model.emb.register_forward_hook(_fail_in_backward) if fail else None
        model.zero_grad()
        try:
            loss_of(ddp, x, y, "plain").backward()
        except RuntimeError as err:
            assert fail and "boom" in str(err), err
        finally:
            if failing is not None:
                failing.remove()
        return grads_of(model)

    def new_ddp(state):
        gc.collect()  # a DDP dropped before goes, with its reducer's hooks on the parameters
        ddp = DistributedDataParallel(model, bucket_cap_mb=CAP_MB)
        state.register(ddp)
        return ddp

    kept, fresh = (CodecHookState("topk-global", settings=SETTINGS, model=model, compress_after=0) for _ in "ab")
    ddp = new_ddp(kept)
    backward(ddp)  # DDP's first iteration (one bucket); its buckets are rebuilt after it
    backward(ddp, fail=True)
    held_after_failure = len(kept._held)
    del ddp
    again = backward(new_ddp(kept))
    backward(new_ddp(fresh))  # the same first step, with no failure after it
    never_failed = backward(new_ddp(fresh))
    kept.close()
    fresh.close()
    return held_after_failure, again, never_failed


def _fail_in_backward(module, inputs, output):
    """Backward fails where it reaches the embedding's output: after the later layers' buckets were handed over."""
    def boom(grad):
        raise RuntimeError("boom")

    output.register_hook(boom)


def whole_matrix(rank, world):
    os.environ["LOCAL_WORLD_SIZE"] = "1"  # two "nodes": fp8's two-stage sum and topk-nodes cross between them
    compiled = []

    def compile_model(model):  # every cell's model is a Tiny: dynamo's one cache entry serves them all
        compiled.append(torch.compile(model, backend=COMPILE_BACKEND))
        return compiled[-1]

    refusal_rows = {row: [c for c in MATRIX_CODECS if codecs == "all" or codecs == c
                          or codecs == "sparse" and CODECS[c].sparse] for row, codecs in REFUSED}
    cells = [(combo, codec) for combo in COMBOS for codec in [None, "local", *MATRIX_CODECS]]
    cells += [(row, codec) for row, codecs in refusal_rows.items() for codec in codecs]
    out = {}
    started = time.perf_counter()
    for combo, codec in cells:
        try:
            out[combo, codec] = run_cell(codec, combo, rank, compile_model)
        except Exception as err:  # noqa: BLE001  the parent asserts which cells may be refused, and how
            out[combo, codec] = {"error": f"{type(err).__name__}: {err}"}
        dist.barrier()  # every cell starts together (a rank that failed alone would hang here: the timeout's)
    out["compiled_graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    out["recovery"] = recovery(rank)
    out["seconds"] = time.perf_counter() - started
    return out


def run_with_timeout(fn, world, timeout):
    """`tests.spawn_util.run_workers` with a deadline: workers still running after `timeout` s are killed and the
    test fails, so a hang is a failure, not a stuck suite."""
    mp.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(_entry, args=(fn, world, _free_port(), out, (), "gloo", dict(os.environ)),
                                     nprocs=world, join=False, start_method="forkserver")
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
                if time.monotonic() > deadline:
                    pytest.fail(f"the DDP hook matrix hung: its workers were still running after {timeout} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def matrix():
    return run_with_timeout(whole_matrix, WORLD, TIMEOUT_S)


def cosine(a, b):
    return float(nn.functional.cosine_similarity(a, b, dim=0))


def check_promise(codec_name, cell, reference, local):
    """The gradients and bytes `codec_name` promises, against plain DDP's (`reference`) and each rank's own
    (`local`, at the first step, where every run has the same parameters)."""
    codec, n = make_codec(codec_name, SETTINGS), reference[0].numel()
    got = cell["grads"]
    assert all(torch.isfinite(g).all() for g in got)
    wire = CODECS[codec_name].wire_bytes
    sent = cell["bytes"]
    if wire is not None:  # a dense codec: its width per element around the ring of 2 (+ fp8's flag bytes)
        assert all(wire * n <= b <= wire * n + 64 for b in sent), (sent, wire * n)
    else:
        assert all(0 < b < 4 * n for b in sent), (sent, 4 * n)  # fewer bytes than fp32's
    if isinstance(codec, CastCodec) and codec.wire_dtype is None:  # fp32: plain DDP's gradients, every step
        worst = max((g - r).abs().max().item() for g, r in zip(got, reference))
        assert worst <= 1e-6, worst
    elif isinstance(codec, CastCodec):  # each rank's value and their sum rounded once each to the wire's precision
        info = torch.finfo(codec.wire_dtype)
        bound = info.eps * (local[0].abs() + local[1].abs()) / 2 + 2 * info.smallest_normal * info.eps
        excess = ((got[0] - reference[0]).abs() - bound).max().item()
        assert excess <= 0, excess
    elif isinstance(codec, Fp8Codec):
        assert cosine(got[0], reference[0]) > 0.99
    elif isinstance(codec, LowrankCodec):  # rank-1 factors of the (error +) gradient: a descent direction
        assert cosine(got[0], reference[0]) > 0.3
    elif CODECS[codec_name].sparse:  # top-k of the (residual +) gradient: most of its norm
        assert cosine(got[0], reference[0]) > 0.5
    elif isinstance(codec, OnebitCodec):  # signs of the momentum, (1 − β1)·g at the first step
        # Each rank sends its part's signs times one scale; the server's mean of those has, wherever every rank's
        # gradient has the same sign, that sign (a sum of like-signed terms), and it sends that sign again. Elsewhere
        # the sign is that of the rank with the larger scale, which depends on DDP's buckets, and may be against the
        # mean's there: not even a positive cosine with the mean is promised.
        signs = torch.stack([torch.sign(g) for g in local])
        agreed = (signs == signs[0]).all(0) & (signs[0] != 0)
        count = int(agreed.sum())
        assert count > n // 4, (count, n)  # two ranks' batches agree on about half the elements
        wrong = int((torch.sign(got[0][agreed]) != signs[0][agreed]).sum())
        assert wrong == 0, f"{wrong} of the {count} elements whose sign every rank agrees on have the other sign"
    else:
        raise AssertionError(f"nothing here checks what {codec_name} promises: add it")


@pytest.mark.parametrize("combo", COMBOS)
def test_every_codec_trains_under_the_combination(matrix, combo):
    ranks = matrix
    reference = ranks[0][combo, None]
    assert "error" not in reference, reference["error"]
    local = [r[combo, "local"]["grads"][0] for r in ranks]
    for codec in MATRIX_CODECS:
        cells = [r[combo, codec] for r in ranks]
        assert "error" not in cells[0], (codec, cells[0]["error"])
        assert cells[0]["after"] < cells[0]["before"], (codec, cells[0]["before"], cells[0]["after"])
        for other in cells[1:]:  # every rank holds the same mean
            assert all(torch.equal(a, b) for a, b in zip(cells[0]["grads"], other["grads"])), codec
        try:
            check_promise(codec, cells[0], reference["grads"], local)
        except AssertionError as err:
            raise AssertionError(f"{codec} under {combo}: {err}") from err


def test_unsupported_is_refused_in_one_clear_line(matrix):
    for (row, codecs), words in REFUSED.items():
        refused = [key for key in matrix[0] if isinstance(key, tuple) and key[0] == row]
        assert refused, row
        for key in refused:
            for rank in matrix:
                error = rank[key].get("error", "")
                assert error.startswith("ValueError: ") and words in error and "\n" not in error, (key, error)


def test_the_compiled_model_was_compiled(matrix):
    assert matrix[0]["compiled_graphs"] >= 1  # dynamo captured Tiny, not a silent fallback to eager


def test_a_failed_backward_leaves_nothing_held_for_the_next(matrix):
    for held_after_failure, again, fresh in (rank["recovery"] for rank in matrix):
        assert held_after_failure > 0  # the failure came after DDP handed over some buckets
        assert torch.equal(again, fresh)

