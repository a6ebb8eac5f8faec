"""ImageNet transforms on Pillow images: hand-computed boxes, exact pixels, deterministic draws and JPEG draft."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from scalesgd.data.imagefolder.transforms import (
    ATTEMPTS,
    EVAL_RESIZE,
    RATIO,
    SCALE,
    centre_box,
    eval_image,
    plain_image,
    random_resized_crop_box,
    to_uint8_tensor,
    train_image,
)

BILINEAR = Image.Resampling.BILINEAR


def hand_box(width: int, height: int, generator: torch.Generator, scale=SCALE, ratio=RATIO):
    """The documented draws, written out again: area then aspect per attempt, then top then left."""
    for _ in range(ATTEMPTS):
        target = width * height * (scale[0] + (scale[1] - scale[0]) * torch.rand((), generator=generator).item())
        low, high = math.log(ratio[0]), math.log(ratio[1])
        aspect = math.exp(low + (high - low) * torch.rand((), generator=generator).item())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=generator))
            left = int(torch.randint(0, width - w + 1, (), generator=generator))
            return left, top, w, h
    return hand_fallback(width, height, ratio)


def hand_fallback(width: int, height: int, ratio=RATIO) -> tuple[int, int, int, int]:
    """The centre crop with the aspect clamped into ratio."""
    if width / height < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif width / height > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def gradient_image(width: int, height: int) -> Image.Image:
    """Smooth RGB with red = x, green = y, so a shifted box or a mirrored column changes the pixels."""
    y, x = np.mgrid[:height, :width]
    red, green = x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1)
    pixels = np.stack([red, green, (red + green) // 2], axis=-1)
    return Image.fromarray(pixels.astype(np.uint8), "RGB")


def hwc(tensor: torch.Tensor) -> np.ndarray:
    return tensor.permute(1, 2, 0).numpy()


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
@pytest.mark.parametrize(("width", "height"), [(500, 375), (375, 500), (64, 64), (1000, 10)])
def test_box_equals_the_hand_computed_draws(seed, width, height):
    got = random_resized_crop_box(width, height, torch.Generator().manual_seed(seed))
    assert got == hand_box(width, height, torch.Generator().manual_seed(seed))


def test_box_draws_exactly_two_uniforms_per_attempt_then_top_and_left():
    generator = torch.Generator().manual_seed(0)
    random_resized_crop_box(500, 375, generator)
    replay = torch.Generator().manual_seed(0)
    hand_box(500, 375, replay)
    assert torch.equal(generator.get_state(), replay.get_state())


def test_fallback_is_the_clamped_centre_crop():
    # 1000x10 has aspect 100: no box of 90-100% of the area has an aspect within [3/4, 4/3], so every attempt fails.
    generator = torch.Generator().manual_seed(0)
    box = random_resized_crop_box(1000, 10, generator, scale=(0.9, 1.0))
    width = round(10 * 4 / 3)
    assert box == ((1000 - width) // 2, 0, width, 10) == (493, 0, 13, 10)
    replay = torch.Generator().manual_seed(0)
    for _ in range(2 * ATTEMPTS):
        torch.rand((), generator=replay)
    assert torch.equal(generator.get_state(), replay.get_state())  # all attempts drawn, no position drawn


def test_fallback_of_a_tall_image_and_of_one_within_ratio():
    assert random_resized_crop_box(10, 1000, torch.Generator().manual_seed(0), scale=(0.9, 1.0)) == (0, 493, 10, 13)
    # Aspect 1 is within ratio: the whole image, as the scale range above 1 never fits.
    assert random_resized_crop_box(30, 30, torch.Generator().manual_seed(0), scale=(1.5, 2.0)) == (0, 0, 30, 30)


@settings(max_examples=200, deadline=None)
@given(width=st.integers(1, 2000), height=st.integers(1, 2000), seed=st.integers(0, 2**32 - 1))
def test_box_lies_inside_and_respects_scale_and_ratio(width, height, seed):
    left, top, w, h = box = random_resized_crop_box(width, height, torch.Generator().manual_seed(seed))
    assert w > 0 and h > 0 and left >= 0 and top >= 0 and left + w <= width and top + h <= height
    if box == hand_fallback(width, height):
        return
    # w and h are rounded square roots, so only target and aspect values within half a pixel are possible.
    area = width * height
    assert (w + 0.5) * (h + 0.5) >= SCALE[0] * area and (w - 0.5) * (h - 0.5) <= SCALE[1] * area
    assert (w + 0.5) / (h - 0.5) >= RATIO[0] and (w - 0.5) / (h + 0.5) <= RATIO[1]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_box_refuses_a_bad_side(bad):
    with pytest.raises(ValueError, match="width"):
        random_resized_crop_box(bad, 10, torch.Generator())


def test_box_refuses_a_reversed_range():
    with pytest.raises(ValueError, match="scale"):
        random_resized_crop_box(10, 10, torch.Generator(), scale=(1.0, 0.5))


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_train_image_is_the_drawn_box_resized_then_maybe_flipped(seed):
    image, size = gradient_image(60, 40), 24
    got = train_image(image, size, torch.Generator().manual_seed(seed))

    replay = torch.Generator().manual_seed(seed)
    left, top, w, h = hand_box(60, 40, replay)
    flipped = torch.rand((), generator=replay).item() < 0.5
    # Resizing a box reads the pixels just outside it for the filter (as resizing the whole image would), while a
    # tight crop() clamps there: crop with a margin wider than the filter's reach, then resize the box within it.
    margin = math.ceil(max(w, h) / size) + 1
    outer = (max(0, left - margin), max(0, top - margin), min(60, left + w + margin), min(40, top + h + margin))
    inner = (left - outer[0], top - outer[1], left - outer[0] + w, top - outer[1] + h)
    expected = image.crop(outer).resize((size, size), BILINEAR, box=inner)
    if flipped:
        expected = expected.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    assert got.dtype == torch.uint8 and got.shape == (3, size, size)
    assert np.array_equal(hwc(got), np.asarray(expected))


def test_flip_reverses_the_columns_of_the_same_crop():
    image = gradient_image(60, 40)
    seeds = [seed for seed in range(20) if _flip_draw(seed) < 0.5]
    assert seeds, "some seed among 20 flips"
    for seed in seeds[:3]:
        plain = train_image(image, 16, torch.Generator().manual_seed(seed), flip=False)
        flipped = train_image(image, 16, torch.Generator().manual_seed(seed), flip=True)
        assert torch.equal(flipped, plain.flip(-1)) and not torch.equal(flipped, plain)


def test_no_flip_draw_when_flip_is_off():
    generator, replay = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    train_image(gradient_image(30, 20), 8, generator, flip=False)
    hand_box(30, 20, replay)
    assert torch.equal(generator.get_state(), replay.get_state())


def _flip_draw(seed: int) -> float:
    """The flip draw that follows the box draws for this seed on a 60x40 image."""
    generator = torch.Generator().manual_seed(seed)
    hand_box(60, 40, generator)
    return torch.rand((), generator=generator).item()


def test_train_image_is_deterministic_and_seeds_differ():
    image = gradient_image(80, 60)
    first = train_image(image, 32, torch.Generator().manual_seed(42))
    again = train_image(image, 32, torch.Generator().manual_seed(42))
    other = train_image(image, 32, torch.Generator().manual_seed(43))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize(("width", "height"), [(500, 375), (375, 500)])
def test_eval_image_is_short_side_resize_then_centre_crop(width, height):
    image = gradient_image(width, height)
    got = eval_image(image, 224)
    assert got.dtype == torch.uint8 and got.shape == (3, 224, 224)
    assert round(224 * EVAL_RESIZE) == 256
    resized_size = (341, 256) if width > height else (256, 341)  # 500 * 256 / 375 = 341.33
    resized = image.resize(resized_size, BILINEAR)
    left, top = (round((resized_size[0] - 224) / 2), round((resized_size[1] - 224) / 2))
    expected = np.asarray(resized.crop((left, top, left + 224, top + 224))).astype(int)
    # One resize of a box and a resize then crop compute the same filter positions along different float paths,
    # so Pillow's fixed-point weights can differ by one unit and a few pixels round the other way.
    difference = np.abs(hwc(got).astype(int) - expected)
    assert difference.max() <= 1
    assert (difference > 0).mean() < 0.01


def test_centre_box_of_500_by_375():
    left, top, right, bottom = centre_box(500, 375, 224, EVAL_RESIZE)
    x_scale, y_scale = 341 / 500, 256 / 375  # the resized image is 341x256; the crop starts at (58, 16)
    assert (left, top, right, bottom) == pytest.approx((58 / x_scale, 16 / y_scale, 282 / x_scale, 240 / y_scale))


def test_eval_refuses_a_ratio_below_one():
    with pytest.raises(ValueError, match="resize_ratio"):
        eval_image(gradient_image(10, 10), 8, resize_ratio=0.5)


def test_plain_image_of_a_square_image_returns_its_pixels():
    pixels = np.arange(64, dtype=np.uint8).reshape(8, 8) * 3
    got = plain_image(Image.fromarray(pixels, "L"), 8)
    assert got.dtype == torch.uint8 and got.shape == (1, 8, 8)
    assert np.array_equal(got[0].numpy(), pixels)


def test_plain_image_of_a_wider_image_is_its_centre_pixels():
    pixels = np.arange(80, dtype=np.uint8).reshape(8, 10)
    got = plain_image(Image.fromarray(pixels, "L"), 8)
    assert np.array_equal(got[0].numpy(), pixels[:, 1:9])


def test_to_uint8_tensor_layout_and_modes():
    rgb = np.random.default_rng(0).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    tensor = to_uint8_tensor(Image.fromarray(rgb, "RGB"))
    assert tensor.shape == (3, 5, 7) and np.array_equal(hwc(tensor), rgb)
    tensor[0, 0, 0] = 1  # writable, and a copy of its own
    with pytest.raises(ValueError, match="'P'"):
        to_uint8_tensor(Image.new("P", (4, 4)))


def test_jpeg_through_train_image_is_deterministic_across_opens(tmp_path):
    path = tmp_path / "gradient.JPEG"
    gradient_image(375, 500).save(path, "JPEG", quality=90)
    outputs = []
    for _ in range(2):
        with Image.open(path) as image:
            assert image.format == "JPEG"
            outputs.append(train_image(image, 64, torch.Generator().manual_seed(9)))
    assert outputs[0].dtype == torch.uint8 and outputs[0].shape == (3, 64, 64)
    assert torch.equal(outputs[0], outputs[1])


def test_jpeg_draft_decodes_reduced_yet_matches_a_full_decode_closely(tmp_path):
    path = tmp_path / "gradient.JPEG"
    gradient_image(375, 500).save(path, "JPEG", quality=90)
    seed = 0  # its box is 343x294 at (3, 119): at size 64 libjpeg may decode at 1/4 scale
    assert random_resized_crop_box(375, 500, torch.Generator().manual_seed(seed)) == (3, 119, 343, 294)
    with Image.open(path) as image:
        drafted = train_image(image, 64, torch.Generator().manual_seed(seed))
        assert image.size == (94, 125)  # decoded at 1/4
    with Image.open(path) as image:
        image.load()  # a loaded image cannot be drafted: full-size pixels
        full = train_image(image, 64, torch.Generator().manual_seed(seed))
    difference = (drafted.int() - full.int()).float()
    assert difference.abs().max() <= 2  # libjpeg's scaled decode rounds differently, nothing more
    # The box follows Pillow's own mapping of the reduced decode (x / 4); taking (94 / 375) instead shifts the crop
    # by a third of a grey level per pixel on the red = x ramp.
    assert difference.mean(dim=(1, 2)).abs().max() < 0.1
