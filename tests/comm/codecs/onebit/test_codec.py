"""The onebit codec with OneBitAdam (Tang et al. 2021): the signs' packing and scales, the error feedback, state
kept per parameter; on 2 gloo ranks the whole algorithm as a float64 reference has it, the same through a DDP hook,
a bit-identical resume, a non-finite rank seen by all with no state changed, and ~32× fewer bytes than fp32."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import BucketView, Channel, CodecSettings, make_codec
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.codecs.onebit import OnebitCodec, OnebitOptions
from scalesgd.comm.codecs.onebit.signs import Message
from scalesgd.comm.engine.ddp_hook import CodecHookState, codec_hook
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.comm.wire.bits import pack, unpack
from scalesgd.comm.wire.collectives import chunk_bounds
from scalesgd.errors import UsageError
from scalesgd.optim.onebit_adam import OneBitAdam
from tests.comm.exchanging import Unscaled, exchange, same_state, view_of
from tests.spawn_util import run_workers

D, N, STEPS, CHUNK = 37, 4, 10, 8  # 37 weights: parts of 19 and 18, chunks of 8, 8 and a short one
HYPER = {"lr": 0.05, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
SETTINGS = CodecSettings(OnebitOptions(beta1=0.9, chunk=CHUNK))
ALONE = Channel(None, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), max_size=70))
def test_signs_pack_eight_to_a_byte_and_unpack_exactly(bits):
    bits = torch.tensor(bits, dtype=torch.bool)
    packed = pack(bits)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-bits.numel() // 8)
    assert torch.equal(unpack(packed, bits.numel()), bits)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 70), st.sampled_from([8, 16, 64]), st.integers(0, 2 ** 31), st.booleans())
def test_a_message_decompresses_to_the_signs_times_each_chunks_rms(n, chunk, seed, zero_chunk):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    if zero_chunk:
        x[:chunk] = 0  # sign(0) is +1 and the scale 0: a chunk of zeros comes back exactly
    message = Message(n, chunk)
    wire, out = torch.zeros(message.size, dtype=torch.uint8), torch.empty(n)
    message.write(x, wire)
    message.read(wire, out)
    for a in range(0, n, chunk):
        part = x[a:a + chunk]
        expected = torch.where(part >= 0, 1.0, -1.0) * part.norm() / part.numel() ** 0.5
        assert torch.allclose(out[a:a + chunk], expected, rtol=1e-6, atol=0)
    if zero_chunk:
        assert torch.equal(out[:chunk], torch.zeros(min(chunk, n)))


def test_alone_the_error_feedback_keeps_what_was_not_sent_and_a_regrouping_keeps_each_parameters():
    params = [torch.zeros(20), torch.zeros(13)]
    codec, g = OnebitCodec(0.9, 8), torch.randn(33, generator=torch.Generator().manual_seed(0))
    flat = g.clone()
    exchange(codec, flat, view_of(params), ALONE)
    c = 0.1 * g  # the first step: m = (1 − β1)·g, no error yet
    assert torch.allclose(codec.moments(view_of(params), flat)["m"], flat)
    assert torch.allclose(flat + codec.moments(view_of(params), flat)["error"], c, atol=1e-6)  # alone e_s stays 0
    state = copy.deepcopy(codec.state_dict())
    alone = BucketView(1, params[1:], [0], 13, (1,))  # a bucket of parameter 1 alone: g = 0 moves its m only
    exchange(codec, torch.zeros(13), alone, ALONE)
    kept, before = codec.state_dict()["moments"]["params"], state["moments"]["params"]
    assert torch.equal(kept[0]["m"], before[0]["m"])
    assert not torch.equal(kept[1]["m"], before[1]["m"])


@pytest.mark.parametrize("bad, name", [({"chunk": 12}, "onebit_chunk"), ({"beta1": 1.0}, "onebit_beta1")])
def test_options_without_meaning_are_refused_by_name(bad, name):
    with pytest.raises(UsageError, match=name):
        make_codec("onebit", CodecSettings(OnebitOptions(**bad)))


# ---- two gloo ranks ---------------------------------------------------------------------------------------

def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, D, generator=g), torch.randn(8, generator=g)


def model_and_optimizer():
    torch.manual_seed(0)
    model = nn.Linear(D, 1, bias=False)
    return model, OneBitAdam(model.parameters(), freeze_step=N, **HYPER)


def backward(model, rank, step, scale=1.0):
    x, y = batch(rank, step)
    (0.5 * ((model(x).squeeze(1) - y) ** 2).mean() * scale).backward()


def weights(model):
    return model.weight.detach().reshape(-1).clone()


def engine_run(rank, steps, start=0, saved=None):
    """`steps` steps through our engine from `saved` (model, engine state) if given; weights after each step."""
    model, optimizer = model_and_optimizer()
    if saved is not None:
        model.load_state_dict(saved[0])
    engine = DistributedOptimizer(optimizer, model, codec=make_codec("onebit", SETTINGS), compress_after=N)
    if saved is not None:
        engine.load_state_dict(saved[1])
    trace = []
    for step in range(start, start + steps):
        engine.zero_grad()
        backward(model, rank, step)
        engine.step()
        trace.append(weights(model))
    state = (copy.deepcopy(model.state_dict()), copy.deepcopy(engine.state_dict()))
    engine.close()
    return trace, state


def ddp_run(rank):
    model, optimizer = model_and_optimizer()
    state = CodecHookState("onebit", settings=SETTINGS, model=model, compress_after=N)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(state, codec_hook)
    trace = []
    for step in range(STEPS):
        optimizer.zero_grad()
        backward(ddp, rank, step)
        optimizer.step()
        trace.append(weights(model))
    state.close()
    return trace


def not_finite(rank):
    """A rank whose loss overflows after the warm-up: NaN on every rank, the step skipped and the codec's state
    unchanged; then on."""
    model, optimizer = model_and_optimizer()
    engine = DistributedOptimizer(optimizer, model, codec=make_codec("onebit", SETTINGS), compress_after=1,
                                  scaler=Unscaled())
    out = []
    for step, scale in enumerate([1.0, float("inf") if rank == 1 else 1.0, 1.0]):
        before = copy.deepcopy(engine.codec.state_dict())
        engine.zero_grad()
        backward(model, rank, step, scale)
        engine.synchronize()
        out.append((model.weight.grad.clone(), same_state(before, engine.codec.state_dict())))
    engine.close()
    return out


def wire_bytes(rank):
    """Bytes this rank sends for one bucket of 2**20 elements: onebit against fp32's ring."""
    channel = Channel(None, 2)
    flat = torch.randn(1 << 20, generator=torch.Generator().manual_seed(rank))
    view = view_of([flat])
    return exchange(OnebitCodec(), flat.clone(), view, channel), exchange(DENSE, flat.clone(), view, channel)


def everything(rank, world):
    whole, _ = engine_run(rank, STEPS)
    first, saved = engine_run(rank, 6)
    rest, _ = engine_run(rank, STEPS - 6, start=6, saved=saved)
    return {"engine": whole, "resumed": first + rest, "ddp": ddp_run(rank), "not_finite": not_finite(rank),
            "bytes": wire_bytes(rank)}


@pytest.fixture(scope="module")
def ranks():
    return run_workers(everything, 2)


def compress(x, chunk=CHUNK):
    """The paper's compressor in float64: each chunk's signs (0 as +) times its ‖·‖₂/√n."""
    out = torch.empty_like(x)
    for a in range(0, x.numel(), chunk):
        part = x[a:a + chunk]
        out[a:a + chunk] = torch.where(part >= 0, 1.0, -1.0) * part.norm() / part.numel() ** 0.5
    return out


def reference():
    """1-bit Adam on 2 workers in float64, as Tang et al. 2021 write it: AdamW on the mean gradient for N steps,
    then each worker's momentum compressed with its error, each part averaged by its server and compressed with
    the server's error, the variance frozen at step N. Weights after each step."""
    model, _ = model_and_optimizer()
    w = weights(model).double()
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    parts = chunk_bounds(D, 2)
    m, v = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    worker_error = [torch.zeros(D, dtype=torch.float64) for _ in range(2)]
    server_error = [torch.zeros(b - a, dtype=torch.float64) for a, b in parts]
    trace = []
    for t in range(1, STEPS + 1):
        g = []
        for rank in range(2):
            x, y = (z.double() for z in batch(rank, t - 1))
            g.append(x.T @ (x @ w - y) / x.shape[0])
        if t <= N:
            mean = (g[0] + g[1]) / 2
            m, v = b1 * m + (1 - b1) * mean, b2 * v + (1 - b2) * mean ** 2
            v_hat = v / (1 - b2 ** t)
        else:
            sent = []
            for rank in range(2):
                c = b1 * m + (1 - b1) * g[rank] + worker_error[rank]
                sent.append(torch.cat([compress(c[a:b]) for a, b in parts]))
                worker_error[rank] = c - sent[rank]
            for j, (a, b) in enumerate(parts):
                s = (sent[0][a:b] + sent[1][a:b]) / 2 + server_error[j]
                m[a:b] = compress(s)
                server_error[j] = s - m[a:b]
            v_hat = v / (1 - b2 ** N)
        w = w * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / (v_hat.sqrt() + eps)
        trace.append(w.clone())
    return trace


def test_codec_and_optimizer_on_two_ranks_follow_the_float64_reference(ranks):
    for step, (ours, theirs) in enumerate(zip(ranks[0]["engine"], reference())):
        assert torch.allclose(ours.double(), theirs, rtol=0, atol=1e-5), (step, (ours - theirs).abs().max())
        assert torch.equal(ours, ranks[1]["engine"][step])  # every rank holds the same weights


def test_as_a_ddp_hook_it_gives_the_engines_weights(ranks):
    for rank in ranks:
        assert all(torch.equal(a, b) for a, b in zip(rank["ddp"], rank["engine"]))


def test_a_run_resumed_after_the_freeze_is_bit_identical(ranks):
    for rank in ranks:
        assert all(torch.equal(a, b) for a, b in zip(rank["resumed"], rank["engine"]))


def test_a_non_finite_rank_makes_every_rank_non_finite_and_changes_no_state(ranks):
    for rank in ranks:
        (dense, dense_same), (flagged, flagged_same), (after, _) = rank["not_finite"]
        assert torch.isfinite(dense).all() and not dense_same  # the warm-up step moved the momentum
        assert torch.isnan(flagged).all() and flagged_same
        assert torch.isfinite(after).all()


def test_after_the_freeze_it_sends_a_32nd_of_fp32s_bytes(ranks):
    for onebit, fp32 in (rank["bytes"] for rank in ranks):
        assert fp32 == 4 << 20  # the ring: 2 · (W − 1)/W · 4 bytes per element
        assert onebit <= fp32 / 16 and onebit / fp32 < 1 / 31.5, onebit / fp32


def test_a_state_saved_before_the_moments_were_kept_flat_loads():
    """A checkpoint whose m and e_w are listed by parameter at the top: each parameter takes its own back."""
    old = {"params": {0: {"m": torch.full((20,), 2.0), "error": torch.full((20,), 3.0)},
                      1: {"m": torch.full((13,), 4.0), "error": torch.zeros(13)}},
           "server": [{"keys": [0, 1], "ranks": 1, "error": torch.ones(33)}]}
    codec = OnebitCodec(0.9, 8)
    codec.load_state_dict(old)
    params = [torch.zeros(20), torch.zeros(13)]
    moments = codec.moments(view_of(params), torch.zeros(33))
    assert torch.equal(moments["m"], torch.cat([torch.full((20,), 2.0), torch.full((13,), 4.0)]))
    assert torch.equal(moments["error"][:20], torch.full((20,), 3.0))
    assert torch.equal(codec.server_error(view_of(params), 1, torch.zeros(33), 33), torch.ones(33))
