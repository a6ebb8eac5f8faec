"""The ImageNet augmentation on Pillow images, drawn from a torch.Generator so a sample's pixels are reproducible.

Training uses the random-resized crop of Szegedy et al. 2015, "Going deeper with convolutions" (a crop covering 8% to
100% of the image with an aspect ratio in [3/4, 4/3], resized to a square) plus a left-right flip, as in the recipe of
Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour"; evaluation resizes the short side to
256/224 of the crop size and takes the centre square. The box algorithm and its draws follow the PyTorch ImageNet
example, so a box can be recomputed by hand from the generator.

Cropping and resizing are one `Image.resize(..., box=...)` call, which reads the pixels just outside the box for the
filter's support as a resize of the whole image followed by a crop would. For a JPEG not yet loaded, `Image.draft`
first asks libjpeg to decode at 1/2, 1/4 or 1/8 scale when the crop keeps at least `size` pixels a side: much faster,
and deterministic, but the pixels differ slightly from those of a full-size decode. Draft changes the image object, so
pass a freshly opened image (as a dataset does per sample).
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np
import torch
from PIL import Image

SCALE = (0.08, 1.0)  # area fraction range of the random-resized crop
RATIO = (3 / 4, 4 / 3)  # aspect (width / height) range of the random-resized crop
EVAL_RESIZE = 256 / 224  # evaluation: short side resized to this times the crop size, then centre-cropped
ATTEMPTS = 10  # random boxes tried before falling back to the centre crop
MODES = {"L": 1, "RGB": 3}  # accepted image modes and their channel counts
DRAFT_SCALES = (8, 4, 2)  # the reductions libjpeg decodes at directly

Box = tuple[float, float, float, float]  # (left, top, right, bottom) in source pixels, as Pillow takes it


def random_resized_crop_box(
    width: int,
    height: int,
    generator: torch.Generator,
    scale: tuple[float, float] = SCALE,
    ratio: tuple[float, float] = RATIO,
) -> tuple[int, int, int, int]:
    """(left, top, crop_width, crop_height), the algorithm of the Inception / PyTorch ImageNet recipe."""
    _check_side("width", width)
    _check_side("height", height)
    _check_range("scale", scale)
    _check_range("ratio", ratio)
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(ATTEMPTS):
        target = area * _uniform(scale[0], scale[1], generator)
        aspect = math.exp(_uniform(log_ratio[0], log_ratio[1], generator))
        crop_width = round(math.sqrt(target * aspect))
        crop_height = round(math.sqrt(target / aspect))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = int(torch.randint(0, height - crop_height + 1, (), generator=generator))
            left = int(torch.randint(0, width - crop_width + 1, (), generator=generator))
            return left, top, crop_width, crop_height
    return _fallback_box(width, height, ratio)


def centre_box(width: int, height: int, size: int, resize_ratio: float) -> Box:
    """The box (left, top, right, bottom) in source pixels that, resized to size×size, equals resizing the short side
    to round(size*resize_ratio) and centre-cropping size×size."""
    _check_side("width", width)
    _check_side("height", height)
    short = _eval_short_side(size, resize_ratio)
    scale = short / min(width, height)
    # The resized image's sides; each axis is scaled by its own rounded side, as a resize to these sides would.
    resized_width = short if width <= height else round(width * scale)
    resized_height = short if height < width else round(height * scale)
    left = int(round((resized_width - size) / 2))
    top = int(round((resized_height - size) / 2))
    x_scale, y_scale = resized_width / width, resized_height / height
    return left / x_scale, top / y_scale, (left + size) / x_scale, (top + size) / y_scale


def train_image(image: Image.Image, size: int, generator: torch.Generator, flip: bool = True) -> torch.Tensor:
    """uint8 (C, size, size): a random-resized crop, resized bilinearly, flipped left-right with probability ½."""
    _check_mode(image)
    _check_side("size", size)
    width, height = image.size  # the box is drawn from the full size, so the draws never depend on draft
    left, top, crop_width, crop_height = random_resized_crop_box(width, height, generator)
    flipped = flip and torch.rand((), generator=generator).item() < 0.5
    box = _draft_box(image, (left, top, left + crop_width, top + crop_height), size)
    out = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if flipped:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return to_uint8_tensor(out)


def eval_image(image: Image.Image, size: int, resize_ratio: float = EVAL_RESIZE) -> torch.Tensor:
    """uint8 (C, size, size): short side resized to round(size*resize_ratio), the centre size×size."""
    _check_mode(image)
    _check_side("size", size)
    box = centre_box(image.width, image.height, size, resize_ratio)
    if _is_pixel_crop(box, size):  # no resampling at all: the pixels come back exactly
        return to_uint8_tensor(image.crop(tuple(int(edge) for edge in box)))
    box = _draft_box(image, box, size)
    return to_uint8_tensor(image.resize((size, size), Image.Resampling.BILINEAR, box=box))


def plain_image(image: Image.Image, size: int) -> torch.Tensor:
    """eval_image at resize_ratio 1: an image already size×size is returned pixel for pixel."""
    return eval_image(image, size, resize_ratio=1.0)


def to_uint8_tensor(image: Image.Image) -> torch.Tensor:
    """(C, H, W) uint8 from an 'L' or 'RGB' image, without a copy through Python lists."""
    _check_mode(image)
    pixels = np.array(image, dtype=np.uint8)  # a writable copy: Pillow's array view is read-only
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    """One uniform draw in [low, high), written out so a test can repeat it."""
    return low + (high - low) * torch.rand((), generator=generator).item()


def _fallback_box(width: int, height: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """The whole image's centre, cut to the nearest aspect within `ratio`, when no random box fitted."""
    in_ratio = width / height
    if in_ratio < ratio[0]:
        crop_width, crop_height = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        crop_width, crop_height = round(height * ratio[1]), height
    else:
        crop_width, crop_height = width, height
    return (width - crop_width) // 2, (height - crop_height) // 2, crop_width, crop_height


def _draft_box(image: Image.Image, box: Box, size: int) -> Box:
    """Let libjpeg decode a fresh JPEG reduced while the box keeps `size` pixels a side; the box in the new pixels."""
    whole = min(box[2] - box[0], box[3] - box[1]) // size  # how many times the box could shrink and still fit
    reduction = next((scale for scale in DRAFT_SCALES if scale <= whole), 1)
    if reduction == 1 or image.format != "JPEG":
        return box
    width, height = image.size
    # Asking for width // reduction makes Pillow pick exactly `reduction`; it does nothing for a loaded image.
    drafted = image.draft(image.mode, (width // reduction, height // reduction))
    if drafted is None:
        return box
    _, (_, _, reduced_width, reduced_height) = drafted  # where Pillow says the original extent now ends
    x_scale, y_scale = reduced_width / width, reduced_height / height
    return box[0] * x_scale, box[1] * y_scale, box[2] * x_scale, box[3] * y_scale


def _is_pixel_crop(box: Box, size: int) -> bool:
    """Whether the box is whole pixels and size×size, so cropping equals resampling it."""
    return all(float(edge).is_integer() for edge in box) and box[2] - box[0] == size and box[3] - box[1] == size


def _eval_short_side(size: int, resize_ratio: float) -> int:
    """The resized short side, refused when smaller than the crop (the centre crop would leave the image)."""
    _check_side("size", size)
    short = round(size * resize_ratio) if math.isfinite(resize_ratio) else 0
    if short < size:
        raise ValueError(f"resize_ratio must make round(size * resize_ratio) >= size, i.e. >= 1, got {resize_ratio!r}")
    return short


def _check_side(name: str, value: int) -> None:
    """Refuse a side that is not a positive int before it reaches Pillow or torch."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _check_range(name: str, bounds: tuple[float, float]) -> None:
    """Refuse a (low, high) range that is empty, reversed or not positive."""
    low, high = bounds
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {bounds!r}")


def _check_mode(image: Image.Image) -> None:
    """Refuse modes other than 'L' and 'RGB', so a palette or CMYK image is converted by the caller, not misread."""
    if image.mode not in MODES:
        raise ValueError(f"image mode must be 'L' or 'RGB', got {image.mode!r}: convert it first, e.g. .convert('RGB')")
