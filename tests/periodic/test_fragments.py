"""Fragments of whole layers, and the staggered schedule on which they synchronise."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scalesgd.periodic.fragments import layers, split
from scalesgd.periodic.schedule import Schedule


def model():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4), nn.LayerNorm(4))


def test_split_keeps_layers_whole_in_order_and_balances_sizes():
    net = model()
    parts = split(net, 2)
    flat = [p for part in parts for p in part]
    assert [id(p) for p in flat] == [id(p) for p in net.parameters()]  # every parameter once, in order
    starts = {id(group[0]) for group in layers(net)}
    assert all(id(part[0]) in starts for part in parts)  # a fragment starts where a layer does
    sizes = [sum(p.numel() for p in part) for part in parts]
    assert sizes == [8 * 32 + 32, 32 * 32 + 32 + 32 * 4 + 4 + 8]  # the boundary nearest half of 1484


def test_split_gives_every_fragment_a_layer_even_when_one_dominates():
    net = nn.Sequential(nn.Linear(100, 100), nn.Linear(2, 2), nn.Linear(2, 2))
    assert [len(part) for part in split(net, 3)] == [2, 2, 2]


def test_split_refuses_more_fragments_than_layers():
    with pytest.raises(ValueError, match="fragments 5: give 1 to 4"):
        split(model(), 5)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.data())
def test_each_fragment_lands_once_a_round_after_starting_delay_steps_before(period, fragments, data):
    delay = data.draw(st.integers(0, period - 1))
    schedule = Schedule(period * fragments, fragments, delay)
    rounds = 3
    landed = {f: [] for f in range(fragments)}
    started = {f: [] for f in range(fragments)}
    for step in range(1, rounds * schedule.local_steps + 1):
        if schedule.lands(step) is not None:
            landed[schedule.lands(step)].append(step)
        if schedule.starts(step) is not None:
            started[schedule.starts(step)].append(step)
    for f in range(fragments):
        assert landed[f] == [(k * fragments + f + 1) * period for k in range(rounds)]
        assert [s + delay for s in started[f]] == landed[f][:len(started[f])]
    assert schedule.lands(0) is None and schedule.starts(0) is None


def test_one_fragment_without_delay_is_diloco_every_h_steps():
    schedule = Schedule(5)
    assert [s for s in range(1, 16) if schedule.lands(s) is not None] == [5, 10, 15]
    assert [s for s in range(1, 16) if schedule.starts(s) is not None] == [5, 10, 15]


@pytest.mark.parametrize("h,f,tau,match", [(0, 1, 0, "local_steps 0"), (6, 4, 0, "fragments 4: give a divisor"),
                                          (6, 2, 3, "overlap_steps 3: give 0 to 2")])
def test_schedule_refuses_what_cannot_run(h, f, tau, match):
    with pytest.raises(ValueError, match=match):
        Schedule(h, f, tau)


def test_a_tied_weight_is_in_one_fragment_once():
    embed, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = embed.weight  # a GPT's tied embedding and head
    net = nn.Sequential(embed, nn.Linear(4, 4), head)
    parts = split(net, 2)
    assert [id(p) for part in parts for p in part] == [id(p) for p in net.parameters()]
