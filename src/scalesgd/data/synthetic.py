"""A generated image classification task of any size and shape: learnable, not trivial, reproducible."""

from __future__ import annotations

from numbers import Integral

import torch
import torch.nn.functional as F

from scalesgd.data.dataset import DataBundle, Split

TEMPLATE_GRID = 4  # class templates are random GRIDxGRID fields upsampled, i.e. smooth and low-frequency
NOISE_GRID = 4  # smooth noise lives at the same scale as the templates, so it really confuses them
CONTRAST_RANGE = (0.5, 1.5)
# Noise levels tuned so a tiny 2-conv CNN reaches roughly 80-95% test accuracy after a few epochs
# at 32x32 with 5000 samples (about 40-55% after one epoch), while nearest-class-mean gets ~70%.
SMOOTH_NOISE = 0.8  # std of the smooth noise relative to a unit-std template
WHITE_NOISE = 0.8  # std of the per-pixel noise relative to a unit-std template
CHUNK = 2048  # samples generated per step; fixed, because results depend on it
CHUNK_COPIES = 5  # images of a chunk alive at once while it is made: shifts, smooth and white noise


def load_synthetic_bundle(
    samples: int,
    image_size: int,
    num_classes: int = 10,
    channels: int = 3,
    test_samples: int | None = None,
    seed: int = 1234,
) -> DataBundle:
    """Generate a deterministic template-matching task: shifted, rescaled, noisy class templates.

    Each class has one smooth random template; a sample is its class template circularly
    shifted by up to ``image_size // 4`` pixels, scaled by a contrast in [0.5, 1.5], plus
    smooth and white noise. Both splits are standardised with the train mean and std.
    """
    if test_samples is None:
        test_samples = max(samples // 5, num_classes)
    for name, value, low in (
        ("samples", samples, 1),
        ("image_size", image_size, 1),
        ("num_classes", num_classes, 2),
        ("channels", channels, 1),
        ("test_samples", test_samples, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
            raise ValueError(f"load_synthetic_bundle {name} must be an int >= {low}, got {value!r}")
    if channels * image_size * image_size < 2:
        raise ValueError("load_synthetic_bundle needs channels * image_size**2 >= 2 so templates can differ, got 1")

    samples, image_size, num_classes, channels, test_samples = map(
        int, (samples, image_size, num_classes, channels, test_samples)
    )
    generator = torch.Generator().manual_seed(int(seed))
    templates = _templates(num_classes, channels, image_size, generator)
    # Two further seeds drawn after the templates give train and test independent streams.
    train_seed, test_seed = torch.randint(0, 2**62, (2,), generator=generator).tolist()

    train = _generate(templates, samples, torch.Generator().manual_seed(train_seed))
    test = _generate(templates, test_samples, torch.Generator().manual_seed(test_seed))
    mean, std = _moments(train.x)
    for split in (train, test):
        split.x.sub_(mean).div_(std)
    return DataBundle(
        train=train,
        test=test,
        num_classes=num_classes,
        in_channels=channels,
        image_size=image_size,
        augment=False,
    )


def synthetic_bytes(samples: int, image_size: int, num_classes: int = 10, channels: int = 3,
                    test_samples: int | None = None) -> int:
    """Bytes `load_synthetic_bundle` holds at its peak, so a size that cannot fit is refused before loading: both
    splits (float32 images, int64 labels), the class templates and one chunk's scratch."""
    if test_samples is None:
        test_samples = max(samples // 5, num_classes)
    image = channels * image_size * image_size * 4
    scratch = min(CHUNK, max(samples, test_samples)) * CHUNK_COPIES * image
    return (samples + test_samples) * (image + 8) + num_classes * image + scratch


def _templates(num_classes: int, channels: int, image_size: int, generator: torch.Generator) -> torch.Tensor:
    """One smooth unit-std template per class, shape (num_classes, C, S, S)."""
    grid = torch.randn(num_classes, channels, TEMPLATE_GRID, TEMPLATE_GRID, generator=generator)
    templates = _upsample(grid, image_size)
    templates -= templates.mean(dim=(1, 2, 3), keepdim=True)
    templates /= templates.std(dim=(1, 2, 3), correction=0, keepdim=True).clamp_min(1e-6)
    return templates


def _generate(templates: torch.Tensor, count: int, generator: torch.Generator) -> Split:
    """Draw `count` samples in fixed-size chunks so peak memory stays near the size of the result."""
    num_classes, channels, size, _ = templates.shape
    labels = torch.randperm(count, generator=generator) % num_classes  # exactly balanced, shuffled
    x = torch.empty(count, channels, size, size)
    max_shift = size // 4
    for start in range(0, count, CHUNK):
        y = labels[start : start + CHUNK]
        n = y.shape[0]
        shift_rows = torch.randint(-max_shift, max_shift + 1, (n,), generator=generator)
        shift_cols = torch.randint(-max_shift, max_shift + 1, (n,), generator=generator)
        low, high = CONTRAST_RANGE
        contrast = low + (high - low) * torch.rand(n, 1, 1, 1, generator=generator)
        smooth = _upsample(torch.randn(n, channels, NOISE_GRID, NOISE_GRID, generator=generator), size)
        smooth /= smooth.std(dim=(1, 2, 3), correction=0, keepdim=True).clamp_min(1e-6)  # unit std, like the templates
        white = torch.randn(n, channels, size, size, generator=generator)
        chunk = _circular_shift(templates[y], shift_rows, shift_cols)
        chunk.mul_(contrast).add_(smooth, alpha=SMOOTH_NOISE).add_(white, alpha=WHITE_NOISE)
        x[start : start + n] = chunk
    return Split(x=x, y=labels)


def _upsample(grid: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinearly resize (N, C, g, g) fields to (N, C, size, size)."""
    return F.interpolate(grid, size=(size, size), mode="bilinear", align_corners=False)


def _circular_shift(images: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Roll each image by its own (rows[i], cols[i]) with wrap-around, via one gather per axis."""
    n, c, h, w = images.shape
    row_index = (torch.arange(h)[None, :] - rows[:, None]) % h
    col_index = (torch.arange(w)[None, :] - cols[:, None]) % w
    images = images.gather(2, row_index[:, None, :, None].expand(n, c, h, w))
    return images.gather(3, col_index[:, None, None, :].expand(n, c, h, w))


def _moments(x: torch.Tensor) -> tuple[float, float]:
    """Scalar mean and std of a tensor, accumulated chunkwise in float64 to avoid a full-size temporary."""
    total = 0.0
    total_sq = 0.0
    for start in range(0, x.shape[0], CHUNK):
        chunk = x[start : start + CHUNK].double()
        total += float(chunk.sum())
        total_sq += float(chunk.square().sum())
    count = x.numel()
    mean = total / count
    return mean, max(total_sq / count - mean * mean, 1e-12) ** 0.5

