"""The small GPT: causal, tied head, GPT-2's init, learns a repeating sequence, its options and its FLOPs."""

import math

import pytest
import torch
import torch.nn.functional as F

from scalesgd.errors import UsageError
from scalesgd.models.gpt import GPT, GptOptions, gpt
from scalesgd.options import check_fields

TINY = GptOptions(layers=2, heads=2, width=16, block=8)


def test_logits_at_a_position_do_not_depend_on_later_tokens():
    torch.manual_seed(0)
    model = gpt(32, TINY).eval()
    tokens = torch.randint(0, 32, (2, 8))
    changed = tokens.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % 32
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :4], after[:, :4], atol=1e-6)
    assert not torch.allclose(before[:, 4:], after[:, 4:], atol=1e-6)  # the change did reach the later positions


def test_head_weight_is_the_token_embedding_and_is_listed_once():
    model = gpt(32, TINY)
    assert model.head.weight is model.tok.weight
    params = list(model.parameters())
    assert sum(p is model.tok.weight for p in params) == 1
    assert len({id(p) for p in params}) == len(params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_gives_vocab_logits_per_token_in_the_compute_dtype(dtype):
    model = gpt(32, TINY).to(dtype)
    logits = model(torch.randint(0, 32, (3, 5)))
    assert logits.shape == (3, 5, 32) and logits.dtype == dtype


def test_input_longer_than_the_block_raises_naming_both_lengths():
    model = gpt(32, TINY)
    with pytest.raises(ValueError, match=r"(?s)(?=.*\b9\b)(?=.*\b8\b)"):
        model(torch.zeros(1, 9, dtype=torch.int64))


def test_residual_projections_start_at_gpt2_scaled_std_and_others_at_002():
    torch.manual_seed(0)
    layers = 4
    model = gpt(64, GptOptions(layers=layers, heads=4, width=256, block=8))
    scaled = 0.02 / math.sqrt(2 * layers)
    block = model.blocks[0]
    for proj in (block.attn.proj, block.mlp[2]):
        assert proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
        assert not proj.bias.any()
    assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.tok.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_a_few_adamw_steps_lower_the_cross_entropy_on_a_repeating_byte_sequence():
    torch.manual_seed(0)
    model = gpt(256, GptOptions(layers=2, heads=2, width=32, block=16))
    data = torch.tensor(list(b"scalesgd! " * 20), dtype=torch.int64)
    x = torch.stack([data[i:i + 16] for i in range(0, 64, 4)])
    y = torch.stack([data[i + 1:i + 17] for i in range(0, 64, 4)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 5.0  # ≈ ln 256 at init
    # below 2.16 nats, the byte frequencies' entropy: only the context predicts this well
    assert losses[-1] < 0.5


def test_problem_names_width_and_heads_when_width_does_not_split_into_heads():
    problem = GptOptions(width=130, heads=4).problem()
    assert problem and "130" in problem and "4" in problem
    assert GptOptions().problem() is None
    with pytest.raises(ValueError, match="130"):
        gpt(32, GptOptions(width=130, heads=4))


def test_check_fields_refuses_zero_layers_naming_the_prefixed_option():
    with pytest.raises(UsageError, match="`gpt_layers` 0"):
        check_fields(GptOptions(layers=0), prefix="gpt")
    with pytest.raises(UsageError, match="gpt_dropout"):
        check_fields(GptOptions(dropout=1.0), prefix="gpt")
    check_fields(GptOptions(), prefix="gpt")


@pytest.mark.parametrize("field,value,bound", [("block", 100_000, 4096), ("width", 10**6, 12288), ("layers", 1000, 96)])
def test_a_gpt_size_past_its_bound_is_refused_at_once_with_the_reason(field, value, bound):
    with pytest.raises(UsageError, match=rf"`gpt_{field}` {value}: must be in \[1, {bound}\] \(") as err:
        check_fields(GptOptions(**{field: value}), prefix="gpt")
    assert "GPT-" in str(err.value)  # the reason: the sizes of the models the bound is taken from
    check_fields(GptOptions(**{field: bound}), prefix="gpt")


def test_gpt_block_100000_is_one_line_not_a_silent_hang(tmp_path, capsys):
    from scalesgd.cli import main

    assert main(["train", "--run-dir", str(tmp_path / "run"), "--dataset", "text", "--model", "gpt", "--gpt-block",
                 "100000", "--batch-size", "2"]) == 2
    err = capsys.readouterr().err
    assert err == ("scalesgd: error: --gpt-block 100000: must be in [1, 4096] (tokens; attention's time and memory "
                   "grow with its square: GPT-2 takes 1024, GPT-3 2048)\n")
    assert not (tmp_path / "run").exists()


def test_flops_per_token_is_twice_the_non_embedding_parameters_plus_the_attention_term():
    model = gpt(10, GptOptions(layers=2, heads=2, width=8, block=4))
    w = 8
    per_block = 2 * w + (3 * w * w + 3 * w) + (w * w + w) + 2 * w + (4 * w * w + 4 * w) + (4 * w * w + w)
    non_embedding = 2 * per_block + 2 * w  # blocks and the final LayerNorm = 1760
    assert non_embedding == 1760
    assert model.flops_per_token() == 2 * 1760 + 2 * 2 * 4 * 8 == 3648
    assert isinstance(model, GPT)
