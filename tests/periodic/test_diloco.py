"""Periodic synchronisation against our synchronous engine and a float64 reference of DiLoCo's and Streaming
DiLoCo's update, error feedback kept across rounds, and a checkpoint taken mid-round with an exchange in flight."""

import copy

import pytest
import torch
from torch import nn

from scalesgd.comm.codecs import CodecSettings, TopkOptions
from scalesgd.comm.codecs.sparseloco import SparseLocoOptions
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.comm.wire.groups import own_group
from scalesgd.comm.wire.membership import Membership
from scalesgd.periodic import DiLoCo, Schedule, outer_sgd, split
from tests.spawn_util import run_workers

WORLD = 2


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(rank: int, step: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 6, generator=g).to(dtype), torch.randint(0, 3, (8,), generator=g)


def inner_step(model, optimizer, rank, step, dtype=torch.float32):
    x, y = batch(rank, step, dtype)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


# ---- H = 1, plain averaging: the synchronous engine ---------------------------------------------------------
def h1_against_engine(rank, world, steps):
    model = net()
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with DiLoCo(model, inner, 1, outer_optimizer=outer_sgd(list(model.parameters()), lr=1.0, momentum=0.0)) as d:
        for step in range(steps):
            inner_step(model, inner, rank, step)
    periodic = flat(model.parameters())
    model = net()
    engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, "fp32")
    for step in range(steps):
        inner_step(model, engine, rank, step)
    engine.close()
    return periodic, flat(model.parameters()), d.rounds


def test_one_local_step_with_plain_averaging_is_the_synchronous_engine():
    for periodic, synchronous, rounds in run_workers(h1_against_engine, WORLD, 6):
        assert rounds == 6
        torch.testing.assert_close(periodic, synchronous, rtol=0, atol=1e-6)


# ---- H > 1, fragments, overlap, mixing: a float64 reference ---------------------------------------------------
def reference(h, fragments, delay, mix, steps, carry=False):
    """Streaming DiLoCo's update in float64 for every worker in one process: AdamW inside, each fragment's mean
    pseudo-gradient stepping the global parameters with Nesterov SGD when it lands, the local ones mixed in (`carry`:
    instead, what each worker's steps moved them since the round started, added to the new global ones)."""
    base = net().double()
    workers = [copy.deepcopy(base) for _ in range(WORLD)]
    inners = [adamw(w.parameters()) for w in workers]
    global_model = copy.deepcopy(base)
    outer = outer_sgd(list(global_model.parameters()))
    parts = [[i for i, p in enumerate(base.parameters()) if any(p is q for q in part)]
             for part in split(base, fragments)]
    schedule, sent = Schedule(h, fragments, delay), {}
    for step in range(1, steps + 1):
        for rank, (w, o) in enumerate(zip(workers, inners)):
            inner_step(w, o, rank, step - 1, torch.float64)
        started = schedule.starts(step)
        if started is not None:
            sent[started] = [[g.detach() - list(w.parameters())[i].detach()
                              for i, g in enumerate(global_model.parameters())] for w in workers]
        landed = schedule.lands(step)
        if landed is not None:
            deltas = sent.pop(landed)
            moved = [{i: list(w.parameters())[i].detach() - (g.detach() - d[i])  # θ_local − θ_local at the start
                      for i, g in enumerate(global_model.parameters())} for w, d in zip(workers, deltas)]
            for i, g in enumerate(global_model.parameters()):
                g.grad = sum(d[i] for d in deltas) / WORLD if i in parts[landed] else None
            outer.step()
            with torch.no_grad():
                for w, m in zip(workers, moved):
                    for i in parts[landed]:
                        local, new = list(w.parameters())[i], list(global_model.parameters())[i]
                        local.copy_(new + m[i] if carry else torch.lerp(new, local, mix))
    return [flat(w.parameters()) for w in workers], flat(global_model.parameters())


def periodic_run(rank, world, h, fragments, delay, mix, steps, carry):
    model = net()
    inner = adamw(model.parameters())
    with DiLoCo(model, inner, h, fragments=fragments, overlap_steps=delay, mix=mix, carry=carry) as d:
        for step in range(steps):
            inner_step(model, inner, rank, step)
        return flat(model.parameters()), flat(d.global_params), d.rounds


@pytest.mark.parametrize("h,fragments,delay,mix,steps,carry", [(3, 1, 0, 0.0, 9, False), (4, 2, 1, 0.25, 12, False),
                                                               (4, 1, 2, 0.0, 12, True)],
                         ids=["diloco", "streaming", "carry"])
def test_matches_a_float64_reference_of_the_papers_update(h, fragments, delay, mix, steps, carry):
    want_local, want_global = reference(h, fragments, delay, mix, steps, carry)
    for rank, (local, global_, rounds) in enumerate(run_workers(periodic_run, WORLD, h, fragments, delay, mix, steps,
                                                                carry)):
        assert rounds == steps // (h // fragments)
        torch.testing.assert_close(global_, want_global.float(), rtol=0, atol=2e-5)
        torch.testing.assert_close(local, want_local[rank].float(), rtol=0, atol=2e-5)


# ---- error feedback across rounds --------------------------------------------------------------------------
def topk_rounds(rank, world, rounds):
    model = net()
    inner = adamw(model.parameters())
    settings = CodecSettings(TopkOptions(density=0.05, density_warmup=0, wire="plain"))
    d = DiLoCo(model, inner, 2, codec="topk", settings=settings,
               outer_optimizer=outer_sgd(list(model.parameters()), lr=1.0, momentum=0.0))
    return rounds_seen(model, inner, d, rank, rounds)


def rounds_seen(model, inner, d, rank, rounds):
    """Each round of H 2: (Δ, what was owed before it, what is owed after, how far θ_global moved)."""
    seen = []
    for r in range(rounds):
        inner_step(model, inner, rank, 2 * r)
        d.after_inner_step()
        inner_step(model, inner, rank, 2 * r + 1)
        owed, before = residual(d), flat(d.global_params).clone()
        delta = before - flat(model.parameters())
        d.after_inner_step()  # the round's exchange: an outer SGD at lr 1 moves θ_global by the mean sent
        seen.append((delta, owed, residual(d), before - flat(d.global_params)))
    return seen


def residual(d) -> torch.Tensor:
    """Top-k's residual of every parameter, in the model's order (zeros before the first exchange)."""
    state = d.driver.state_dict()["flat"]["params"]
    if not state:
        return torch.zeros(sum(p.numel() for p in d.params))
    return torch.cat([state[k]["residual"].reshape(-1) for k in sorted(state)])


def test_topk_error_feedback_owes_exactly_what_a_round_did_not_send():
    ranks = run_workers(topk_rounds, WORLD, 3)
    for r in range(3):
        delta, owed, left, _ = zip(*(rank[r] for rank in ranks))
        mean = ranks[0][r][3]
        assert torch.equal(mean, ranks[1][r][3])  # every rank's global parameters moved alike
        sent = sum(d + o - kept for d, o, kept in zip(delta, owed, left))  # each rank sent Δ + owed − what it keeps
        torch.testing.assert_close(sent, WORLD * mean, rtol=0, atol=1e-6)
        density = (mean != 0).float().mean().item()
        assert 0.05 <= density <= 2 * 0.05 + 0.01  # top-k sent its share, from each rank
        assert left[0].abs().sum() > 0.5 * delta[0].abs().sum()  # most of Δ is owed, not lost


def sparseloco_rounds(rank, world, rounds):
    model = net()
    inner = adamw(model.parameters())
    settings = CodecSettings(SparseLocoOptions(chunk=64, top=4, decay=0.9))
    d = DiLoCo(model, inner, 2, codec="sparseloco", settings=settings)  # its recipe's outer step: plain averaging
    return rounds_seen(model, inner, d, rank, rounds)


def test_sparseloco_averages_what_each_rank_sent_from_its_decayed_error_feedback():
    ranks = run_workers(sparseloco_rounds, WORLD, 3)
    for r in range(3):
        delta, owed, left, _ = zip(*(rank[r] for rank in ranks))
        mean = ranks[0][r][3]
        assert torch.equal(mean, ranks[1][r][3])
        sent = sum(d + 0.9 * o - kept for d, o, kept in zip(delta, owed, left))  # e ← β·e + Δ, less what it keeps
        torch.testing.assert_close(sent, WORLD * mean, rtol=0, atol=1e-6)  # θ moved by the mean sent: lr 1, no momentum


# ---- a checkpoint mid-round, an exchange in flight -----------------------------------------------------------
def resumed_mid_round(rank, world, steps, cut, landing):
    def build():
        model = net()
        inner = adamw(model.parameters())
        return model, inner, DiLoCo(model, inner, 4, fragments=2, overlap_steps=1, codec="fp8", **landing)

    model, inner, d = build()
    with d:
        for step in range(steps):
            inner_step(model, inner, rank, step)
    straight = flat(model.parameters())
    model, inner, d = build()
    with d:
        for step in range(cut):
            inner_step(model, inner, rank, step)
        inflight = d.in_flight
        state = copy.deepcopy({"diloco": d.state_dict(), "inner": inner.state_dict(),
                               "local": list(model.parameters())})
    model, inner, d = build()  # a new process would start here
    inner.load_state_dict(state["inner"])
    d.load_state_dict(state["diloco"])
    with torch.no_grad():
        for p, saved in zip(model.parameters(), state["local"]):
            p.copy_(saved)
    with d:
        for step in range(cut, steps):
            inner_step(model, inner, rank, step)
    return straight, flat(model.parameters()), inflight


@pytest.mark.parametrize("landing", [{"mix": 0.25}, {"carry": True}], ids=["mix", "carry"])
def test_resumed_mid_round_with_an_exchange_in_flight_is_exact(landing):
    for straight, resumed, inflight in run_workers(resumed_mid_round, WORLD, 12, 5, landing):
        assert inflight == [(0, 1)]  # fragment 0's second round started after step 5 and lands after step 6
        assert torch.equal(straight, resumed)


# ---- the end of training: a round cut short is averaged ----------------------------------------------------------
def cut_short(rank, world):
    model = net()
    inner = adamw(model.parameters())
    with DiLoCo(model, inner, 4) as d:
        for step in range(6):  # one whole round, then two steps of the next
            inner_step(model, inner, rank, step)
        start, local = flat(d.global_params).clone(), flat(model.parameters())
        momentum = [d.outer.state[p]["momentum_buffer"].clone() for p in d.params]
        d.finish()
        kept = all(torch.equal(m, d.outer.state[p]["momentum_buffer"]) for m, p in zip(momentum, d.params))
        return start, local, flat(d.global_params), flat(model.parameters()), kept


def test_finish_averages_the_workers_over_a_round_cut_short_and_leaves_the_outer_momentum():
    ranks = run_workers(cut_short, WORLD)
    mean_local = sum(r[1] for r in ranks) / WORLD
    for start, _, global_, local, kept in ranks:
        torch.testing.assert_close(global_, mean_local, rtol=0, atol=1e-6)  # θ_global − mean Δ = the workers' mean
        assert torch.equal(local, global_) and kept


# ---- fp16's scaler skipping a step on one rank only ----------------------------------------------------------
def overflow_on_one_rank(rank, world, steps):
    model = net()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    with DiLoCo(model, inner, 2, scaler=scaler) as d:
        for step in range(steps):
            x, y = batch(rank, step)
            scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
            if rank == 1 and step == 0:
                next(model.parameters()).grad.fill_(float("inf"))  # this rank's step overflows; the other's does not
            scaler.step(inner)
            scaler.update()
            inner.zero_grad(set_to_none=True)
        d.finish()
    return d.steps, d.rounds, flat(d.global_params), scaler.get_scale()


def test_a_step_the_scaler_skips_on_one_rank_still_counts_there_so_rounds_stay_together():
    ranks = run_workers(overflow_on_one_rank, WORLD, 5)
    (steps0, rounds0, global0, scale0), (steps1, rounds1, global1, scale1) = ranks
    assert steps0 == steps1 == 5 and rounds0 == rounds1 == 2 + 1  # two whole rounds, and the cut-short one averaged
    assert scale1 < scale0  # rank 1's scaler did skip
    assert torch.equal(global0, global1)


# ---- a round that does not commit ----------------------------------------------------------------------------
class Refusing(Membership):
    """A membership that may abort and refuses its second round."""

    def __init__(self, group):
        super().__init__(group)
        object.__setattr__(self, "asked", [0])

    @property
    def may_abort(self) -> bool:
        return True

    def should_commit(self) -> bool:
        self.asked[0] += 1
        return self.asked[0] != 2


def aborted_round(rank, world):
    model = net()
    inner = adamw(model.parameters())
    settings = CodecSettings(TopkOptions(density=0.05, density_warmup=0, wire="plain"))
    d = DiLoCo(model, inner, 2, codec="topk", settings=settings, group=Refusing(own_group()))
    seen = []
    for step in range(6):
        inner_step(model, inner, rank, step)
        before = (flat(d.global_params).clone(), residual(d).clone(), flat(model.parameters()).clone())
        d.after_inner_step()
        if d.schedule.lands(d.steps) is not None:
            seen.append((before, (flat(d.global_params), residual(d), flat(model.parameters())), d.rounds))
    return seen


def test_a_round_that_does_not_commit_leaves_the_global_parameters_and_the_codec_as_they_were():
    for seen in run_workers(aborted_round, WORLD):
        (before, after, rounds) = seen[1]  # the refused round
        assert rounds == 1
        assert torch.equal(after[0], before[0])  # θ_global as it was
        assert torch.equal(after[1], before[1])  # top-k's residual owes what it owed before the round
        assert torch.equal(after[2], before[2])  # the replica's own steps carry into the next round's Δ
        assert seen[0][2] == 1 and seen[2][2] == 2  # the rounds before and after commit
        assert not torch.equal(seen[2][1][0], after[0])  # and the next round moves θ_global again


def fp8_kernels(rank, world):
    model = net()
    every = DiLoCo(model, adamw(model.parameters()), 1, codec="fp8").codec.every_step
    rounds = DiLoCo(model, adamw(model.parameters()), 16, codec="fp8", settings=CodecSettings(seed=3)).codec
    return every, rounds.every_step


def test_a_periodic_codec_is_built_knowing_its_exchanges_come_every_h_steps():
    """fp8 compiles its kernels only where it exchanges every step (the library and the CLI alike)."""
    from scalesgd.comm.codecs import make_codec
    from scalesgd.config import TrainConfig

    assert run_workers(fp8_kernels, WORLD) == [(True, False)] * WORLD
    for argv, every in ((["--codec", "fp8"], True), (["--codec", "fp8", "--local-steps", "16"], False)):
        settings = TrainConfig.from_argv(argv).codec_settings()
        assert make_codec("fp8", settings).every_step is every and settings.local_steps == (1 if every else 16)
    with pytest.raises(ValueError, match="local_steps 0"):
        CodecSettings(local_steps=0)


# ---- what would train without synchronising is refused at construction ----------------------------------------
def test_arguments_that_would_not_synchronise_are_refused_naming_them():
    model, other = net(), nn.Linear(2, 2)
    inner = adamw(model.parameters())
    cases = [
        (dict(local_steps=1.5), TypeError, "local_steps 1.5: give a whole number"),
        (dict(local_steps="16"), TypeError, "local_steps '16': give a whole number"),
        (dict(inner_optimizer=adamw(other.parameters())), ValueError, "inner_optimizer steps parameters that are not"),
        (dict(outer_optimizer=outer_sgd(list(other.parameters()))), ValueError, "outer_optimizer must step exactly"),
        (dict(fragments=[[next(model.parameters())]]), ValueError, "fragments: give each of the model's 6 trainable "
                                                                   r"parameters in exactly one fragment \(5 left out"),
        (dict(fragments="2"), TypeError, "fragments str"),
        (dict(fragments=9), ValueError, r"fragments 9: give 1 to 4 \(a divisor of local_steps 4\)"),
        (dict(local_steps=8, fragments=8), ValueError, r"fragments 8: give 1 to 3 \(the model's layers"),
        (dict(mix=2.0), ValueError, "mix 2.0: give 0 to 1"),
        (dict(carry=1), TypeError, "carry 1: give True or False"),
        (dict(carry=True), ValueError, "carry True: give overlap_steps 1 or more"),
        (dict(carry=True, overlap_steps=1, mix=0.5), ValueError, "carry True with mix 0.5: give one"),
        (dict(codec="top-k"), KeyError, "unknown codec .top-k.; choose from fp32, fp16, bf16, fp8, fp8-direct, "
                                        "fp8-flat, lowrank, lowrank-acp, onebit, topk"),  # not powersgd
        (dict(codec="powersgd"), ValueError, "powersgd"),
        (dict(settings={"density": 0.1}), TypeError, "settings .* is a dict"),
        (dict(scaler=object()), TypeError, "scaler object"),
        (dict(local_steps=Schedule(4, 2), fragments=2), ValueError, "fragments and overlap_steps come with the "
                                                                     "Schedule given as local_steps"),
    ]
    for given, error, words in cases:
        arguments = {"model": model, "inner_optimizer": inner, "local_steps": 4, **given}
        with pytest.raises(error, match=words):
            DiLoCo(arguments.pop("model"), arguments.pop("inner_optimizer"), arguments.pop("local_steps"),
                   **arguments)


def test_delay_is_overlap_steps_under_its_old_name():
    model = net()
    with pytest.warns(DeprecationWarning, match="overlap_steps"), pytest.raises(ValueError, match="overlap_steps 2"):
        DiLoCo(model, adamw(model.parameters()), 4, fragments=2, delay=2)


# ---- a round outlasting a period ---------------------------------------------------------------------------------
def two_rounds_in_flight(rank, world):
    model = net()
    inner = adamw(model.parameters())
    d = DiLoCo(model, inner, 2)  # rounds started by hand below, not on the schedule
    fragment = d.fragments[0]
    sent = []
    for number in (0, 1):  # the second starts before the first has landed, from other local parameters
        inner_step(model, inner, rank, number)
        sent.append(flat(d.global_params) - flat(model.parameters()))
        fragment.start(number, d.weights, d.driver, None, False)
    means = [torch.cat([m.reshape(-1) for m in fragment.pop(number).means]) for number in (1, 0)]
    return sent, means[::-1], d.in_flight


def test_two_rounds_of_one_fragment_in_flight_each_land_their_own_mean():
    ranks = run_workers(two_rounds_in_flight, WORLD)
    for number in (0, 1):
        mean = sum(sent[number] for sent, _, _ in ranks) / WORLD
        for _, means, in_flight in ranks:
            torch.testing.assert_close(means[number], mean, rtol=0, atol=1e-6)
            assert in_flight == []
