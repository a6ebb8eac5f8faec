"""random_crop_flip: a padded random crop plus random mirror per sample, reproducible, no leaks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalesgd.data import random_crop_flip


def reference_candidates(image: torch.Tensor, padding: int) -> dict[tuple[int, int, bool], torch.Tensor]:
    """Every (top, left, flip) outcome for one (C, H, W) image, computed the slow obvious way."""
    _, h, w = image.shape
    padded = F.pad(image, (padding, padding, padding, padding))
    outcomes = {}
    for top in range(2 * padding + 1):
        for left in range(2 * padding + 1):
            crop = padded[:, top : top + h, left : left + w]
            outcomes[(top, left, False)] = crop
            outcomes[(top, left, True)] = crop.flip(-1)
    return outcomes


def identify(output: torch.Tensor, image: torch.Tensor, padding: int) -> tuple[int, int, bool]:
    matches = [key for key, value in reference_candidates(image, padding).items() if torch.equal(value, output)]
    assert len(matches) == 1, matches
    return matches[0]


def test_each_output_is_exactly_one_padded_crop_optionally_flipped():
    x = torch.randn(64, 3, 8, 10, generator=torch.Generator().manual_seed(0))
    out = random_crop_flip(x, padding=2, generator=torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == x.dtype
    outcomes = [identify(out[i], x[i], 2) for i in range(64)]
    tops = {top for top, _, _ in outcomes}
    lefts = {left for _, left, _ in outcomes}
    flips = [flip for _, _, flip in outcomes]
    assert tops == set(range(5)) and lefts == set(range(5))  # all offsets occur in 64 draws
    assert 10 < sum(flips) < 54  # roughly half flipped


def test_content_actually_moves():
    x = torch.randn(32, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    out = random_crop_flip(x, generator=torch.Generator().manual_seed(3))
    changed = [(not torch.equal(out[i], x[i])) for i in range(32)]
    assert sum(changed) >= 28


def test_no_padding_leaks_beyond_padding_pixels():
    padding = 3
    x = torch.ones(200, 2, 12, 12)
    out = random_crop_flip(x, padding=padding, generator=torch.Generator().manual_seed(4))
    assert torch.all(out[:, :, padding:-padding, padding:-padding] == 1)
    zero_rows = (out == 0).all(dim=3).all(dim=1).sum(dim=1)
    zero_cols = (out == 0).all(dim=2).all(dim=1).sum(dim=1)
    assert int(zero_rows.max()) == padding and int(zero_cols.max()) == padding
    assert set(torch.unique(out).tolist()) == {0.0, 1.0}


def test_padding_zero_is_flip_only():
    x = torch.randn(40, 1, 5, 7)
    out = random_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(5))
    flipped = [torch.equal(out[i], x[i].flip(-1)) for i in range(40)]
    kept = [torch.equal(out[i], x[i]) for i in range(40)]
    assert all(f or k for f, k in zip(flipped, kept)) and any(flipped) and any(kept)


def test_seeded_generator_is_reproducible_and_seed_sensitive():
    x = torch.randn(16, 3, 32, 32)
    a = random_crop_flip(x, generator=torch.Generator().manual_seed(7))
    b = random_crop_flip(x, generator=torch.Generator().manual_seed(7))
    c = random_crop_flip(x, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_default_rng_follows_torch_manual_seed():
    x = torch.randn(16, 3, 32, 32)
    torch.manual_seed(11)
    a = random_crop_flip(x)
    torch.manual_seed(11)
    assert torch.equal(random_crop_flip(x), a)


def test_input_is_not_modified_and_empty_batch_works():
    x = torch.randn(4, 3, 6, 6)
    before = x.clone()
    random_crop_flip(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, before)
    assert random_crop_flip(torch.empty(0, 3, 6, 6)).shape == (0, 3, 6, 6)


@pytest.mark.parametrize(("x", "padding"), [(torch.zeros(3, 8, 8), 4), (torch.zeros(2, 3, 8, 8), -1)])
def test_bad_arguments_raise(x, padding):
    with pytest.raises(ValueError, match="random_crop_flip"):
        random_crop_flip(x, padding=padding)
