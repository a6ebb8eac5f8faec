"""The lowrank codec (Vogels et al. 2019's PowerSGD as ours) on 2 gloo ranks: PyTorch's hook's result on the same
gradients and Q, error feedback that loses nothing, one factor a step when alternating, 16-bit factor wires, a
non-finite rank seen by all with no state changed, a bit-identical resume, and bad options refused by name."""

import copy
import math

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import Channel, CodecSettings, LowrankOptions, make_codec
from scalesgd.comm.codecs.lowrank import codec as lowrank_codec
from scalesgd.comm.codecs.lowrank.factors import layout
from scalesgd.comm.engine.ddp_hook import CodecHookState
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.errors import UsageError
from tests.comm.exchanging import exchange, same_state, view_of
from tests.spawn_util import run_workers

SHAPES = [(48, 20), (48,), (16, 4, 3, 3), (48, 20)]  # two of one shape (batched), a bias, a convolution
OFFSETS, NUMEL = [0, 960, 1008, 1584], 2544


class Weights(nn.Module):
    """Parameters of SHAPES whose loss, given tensors of the same shapes, has those tensors as its gradient."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(shape)) for shape in SHAPES])

    def forward(self, gs: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * g).sum() for p, g in zip(self.weights, gs))


def gradients(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(shape, generator=g) for shape in SHAPES]


def q_of(key: int, rank: int) -> torch.Tensor:
    """The Q both hooks start from for parameter `key`."""
    return torch.randn(math.prod(SHAPES[key][1:]), rank, generator=torch.Generator().manual_seed(7 + key))


# ---- the same result as PyTorch's hook ------------------------------------------------------------------------

def against_pytorch(rank, world, r):
    """One compressed step of each on the same gradients and the same Q: PyTorch's hook under DDP (two plain steps
    first: its warm start needs them; then Q set in its memory), ours as our DDP hook from its first step."""
    theirs = Weights()
    keys = {id(p): i for i, p in enumerate(theirs.weights)}
    state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=r, start_powerSGD_iter=2)

    def with_our_q(st, bucket):
        if st.iter >= st.start_powerSGD_iter:  # its order: matrices grouped by shape, in the bucket's order
            by_shape = {}
            for param in bucket.parameters():
                if param.dim() > 1:
                    by_shape.setdefault(param.view(param.shape[0], -1).shape, []).append(param)
            params = [p for group in by_shape.values() for p in group]
            st.q_memory_dict[bucket.index()] = torch.cat([q_of(keys[id(p)], r).reshape(-1) for p in params])
            st.p_memory_dict[bucket.index()] = torch.empty(sum(p.shape[0] * r for p in params))
        return powerSGD_hook.powerSGD_hook(st, bucket)

    ddp = DistributedDataParallel(theirs)
    ddp.register_comm_hook(state, with_our_q)
    for step in range(3):
        ddp.zero_grad()
        ddp(gradients(rank, 2)).backward()
    pytorch = [p.grad.clone() for p in theirs.weights]

    ours = Weights()
    hook = CodecHookState("lowrank", settings=CodecSettings(LowrankOptions(rank=r)), model=ours, compress_after=0)
    hook.load_state_dict({"params": {k: {"error": torch.zeros(p.numel()), "q": q_of(k, r),
                                         "p": torch.zeros(p.shape[0], r), "phase": 0}
                                     for k, p in enumerate(ours.weights) if p.dim() > 1}})
    ddp = DistributedDataParallel(ours)
    hook.register(ddp)
    ddp(gradients(rank, 2)).backward()
    hook.close()
    return pytorch, [p.grad.clone() for p in ours.weights]


@pytest.mark.parametrize("r", [1, 4])  # Gram-Schmidt at rank 1, QR at 4: PyTorch's hook chooses alike
def test_with_an_fp32_wire_it_gives_pytorchs_powersgd_result_on_the_same_gradients_and_q(r):
    for pytorch, ours in run_workers(against_pytorch, 2, r):
        for theirs, mine, shape in zip(pytorch, ours, SHAPES):
            assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-5), (shape, (mine - theirs).abs().max())
        exact = (gradients(0, 2)[0] + gradients(1, 2)[0]) / 2
        assert not torch.allclose(ours[0], exact, atol=1e-3)  # compressed: not the exact mean


# ---- error feedback, alternating, wires, non-finite -------------------------------------------------------------

def exchanged(rank, world, options, steps=6, poison_at=None, codec="lowrank"):
    """`steps` exchanges of this rank's gradients: what each step's mean was, the exact means, the errors kept, the
    bytes of each step, and the codec's state at the end."""
    params = [torch.zeros(shape) for shape in SHAPES]
    codec = make_codec(codec, CodecSettings(options))
    view, channel = view_of(params), Channel(None, world)
    sent, exact, sizes, states = [], [], [], []
    for step in range(steps):
        flat = torch.cat([g.reshape(-1) for g in gradients(rank, step)])
        mean = flat.clone()
        torch.distributed.all_reduce(mean)
        exact.append(mean / world)
        if step == poison_at and rank == 1:
            flat[5] = float("nan")
        states.append(copy.deepcopy(codec.state_dict()))
        sizes.append(exchange(codec, flat, view, channel))
        sent.append(flat)
    counters = codec.counters()
    errors = torch.cat([codec._states[k].error if k in codec._states else
                        codec._rounding.get(k, torch.zeros(p.numel())) for k, p in enumerate(params)])
    everyone = errors.clone()
    torch.distributed.all_reduce(everyone)
    return sent, exact, everyone / world, sizes, states + [codec.state_dict()], counters


@pytest.mark.parametrize("codec", ["lowrank", "lowrank-acp"])
def test_error_feedback_loses_nothing_what_was_sent_plus_the_mean_error_is_the_sum_of_the_means(codec):
    for sent, exact, mean_error, _, _, counters in run_workers(exchanged, 2, LowrankOptions(rank=2), 6, None, codec):
        assert torch.allclose(sum(sent) + mean_error, sum(exact), atol=1e-4)
        assert mean_error.abs().max() > 1e-3  # rank 2 of random 48×20 matrices: something is still owed
        assert 0 < counters["lowrank_error_ratio"] < 1  # ‖e‖/‖M‖: the factors carried part of the gradient


def test_the_error_ratio_counter_is_measured_on_the_first_step_of_sixteen_and_held_until_the_next():
    for rank, (_, _, _, _, states, counters) in enumerate(run_workers(exchanged, 2, LowrankOptions(rank=2), 6)):
        after_first = states[1]["params"]  # the errors left by step 0, where no error was fed back yet
        first = gradients(rank, 0)
        error_sq = sum(saved["error"].square().sum() for saved in after_first.values())
        gradient_sq = sum(first[key].square().sum() for key in after_first)
        assert counters["lowrank_error_ratio"] == pytest.approx(math.sqrt(error_sq / gradient_sq), rel=1e-6)


def exchanged_in_row_blocks(rank, world, numbers, codec):
    """`exchanged`, each matrix's products and error taken `numbers` numbers of rows at a time (None: whole)."""
    lowrank_codec.ROW_BLOCK["cpu"] = numbers
    return exchanged(rank, world, LowrankOptions(rank=2), 6, None, codec)


@pytest.mark.parametrize("codec", ["lowrank", "lowrank-acp"])
def test_row_blocks_give_the_whole_matrix_result(codec):
    whole = run_workers(exchanged_in_row_blocks, 2, None, codec)
    blocks = run_workers(exchanged_in_row_blocks, 2, 60, codec)  # 3 rows of the 48×20 matrices, 1 of the 16×36
    for (sent, *_, states, _), (sent_in_blocks, *_, states_in_blocks, _) in zip(whole, blocks):
        for a, b in zip(sent, sent_in_blocks):
            assert torch.allclose(a, b, atol=1e-5)  # the same sums in another order (Q over blocks)
        for key, saved in states[-1]["params"].items():  # the errors and factors kept
            assert torch.allclose(saved["error"], states_in_blocks[-1]["params"][key]["error"], atol=1e-5)


def test_lowrank_acp_sends_one_factor_a_step_two_sums_become_one():
    n_dense = 48
    plan = layout(tuple(range(4)), OFFSETS, SHAPES, NUMEL, rank=2, min_rate=2.0)
    both = run_workers(exchanged, 2, LowrankOptions(rank=2))[0][3]
    alternating = run_workers(exchanged, 2, LowrankOptions(rank=2), 6, None, "lowrank-acp")[0][3]
    p_step, q_step = 4 * (plan.p_numel + n_dense), 4 * (plan.q_numel + n_dense)  # fp32 around a ring of 2: n bytes
    assert both == [4 * (plan.p_numel + n_dense + plan.q_numel)] * 6
    assert alternating == [p_step, q_step] * 3


def test_a_16_bit_factor_wire_sends_half_the_bytes_and_nearly_the_same_means():
    fp32 = run_workers(exchanged, 2, LowrankOptions(rank=2))[0]
    fp16 = run_workers(exchanged, 2, LowrankOptions(rank=2, factor_wire="fp16"))[0]
    assert [2 * b for b in fp16[3]] == fp32[3]
    for a, b in zip(fp32[0][:2], fp16[0][:2]):  # the first steps, before the errors' paths part
        assert (a - b).norm() < 2e-3 * a.norm()


@pytest.mark.parametrize("codec", ["lowrank", "lowrank-acp"])
def test_an_fp8_factor_wire_sends_a_byte_a_number_and_its_rounding_is_owed_not_lost(codec):
    fp32 = run_workers(exchanged, 2, LowrankOptions(rank=2), 6, None, codec)[0]
    for sent, exact, mean_error, sizes, states, counters in run_workers(exchanged, 2, LowrankOptions(
            rank=2, factor_wire="fp8"), 6, None, codec):
        flags = [b - f // 4 for b, f in zip(sizes, fp32[3])]  # one byte a number, then fp8's own flag bytes:
        assert all(0 < f <= 2 + 2 * len(SHAPES) for f in flags)  # one a sum, one a factor or uncompressed run
        assert torch.allclose(sum(sent) + mean_error, sum(exact), atol=1e-4)  # the bias's rounding is owed too
        assert (sent[0] - fp32[0][0]).norm() < 0.2 * fp32[0][0].norm()  # e5m2 keeps 2 mantissa bits (≤ 12.5 %)
        assert counters["fp8_saturated"] == 0 and states[-1]["rounding"][1].abs().max() > 0


def test_a_non_finite_gradient_on_one_rank_fills_every_ranks_bucket_and_changes_no_state():
    for sent, _, _, _, states, _ in run_workers(exchanged, 2, LowrankOptions(rank=2), 4, 2):
        assert torch.isfinite(sent[1]).all() and torch.isnan(sent[2]).all() and torch.isfinite(sent[3]).all()
        assert same_state(states[2], states[3])  # the poisoned step kept every error and factor


@pytest.mark.parametrize("bad, name", [({"rank": 0}, "`rank` 0"), ({"min_rate": 0.5}, "lowrank_min_rate")])
def test_options_without_meaning_are_refused_by_name(bad, name):
    with pytest.raises(UsageError, match=name):
        make_codec("lowrank", CodecSettings(LowrankOptions(**bad)))


# ---- resume ----------------------------------------------------------------------------------------------------

def engine_run(rank, world, steps, saved=None, start=0, wire="fp32"):
    weights = Weights()
    engine = DistributedOptimizer(torch.optim.SGD(weights.parameters(), lr=0.01, momentum=0.9), weights,
                                  codec=make_codec("lowrank-acp", CodecSettings(LowrankOptions(rank=2,
                                                                                               factor_wire=wire))),
                                  compress_after=1)
    if saved is not None:
        weights.load_state_dict(saved[0])
        engine.load_state_dict(saved[1])
    for step in range(start, start + steps):
        engine.zero_grad()
        weights(gradients(rank, step)).backward()
        engine.step()
    out = (copy.deepcopy(weights.state_dict()), copy.deepcopy(engine.state_dict()))
    engine.close()
    return out


def resumed(rank, world, wire):
    whole = engine_run(rank, world, 6, wire=wire)
    half = engine_run(rank, world, 3, wire=wire)
    return whole, engine_run(rank, world, 3, half, start=3, wire=wire)


@pytest.mark.parametrize("wire", ["fp32", "fp8"])  # fp8: its ranges and the rounding owed resume too
def test_a_resumed_run_ends_with_the_parameters_and_state_of_an_uninterrupted_one(wire):
    for whole, again in run_workers(resumed, 2, wire):
        assert same_state(whole[0], again[0]) and same_state(whole[1], again[1])
