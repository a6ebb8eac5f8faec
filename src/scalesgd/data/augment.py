"""Batched CIFAR-style augmentation done with index arithmetic, so it costs one gather per batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_crop_flip(
    x: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Zero-pad, randomly crop back to HxW and randomly flip each sample, reproducibly via `generator`."""
    if x.dim() != 4:
        raise ValueError(f"random_crop_flip expects a (N, C, H, W) tensor, got shape {tuple(x.shape)}")
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"random_crop_flip padding must be an int >= 0, got {padding!r}")
    n, c, h, w = x.shape
    # Draw on the generator's device (CPU by default) so results do not depend on x's device.
    gen_device = generator.device if generator is not None else torch.device("cpu")
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=gen_device).to(x.device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=gen_device).to(x.device)
    flip = torch.randint(0, 2, (n,), generator=generator, device=gen_device).to(x.device, torch.bool)
    if n == 0:
        return x.clone()

    padded = F.pad(x, (padding, padding, padding, padding)) if padding else x
    rows = top[:, None] + torch.arange(h, device=x.device)[None, :]
    cols_forward = torch.arange(w, device=x.device)
    cols = left[:, None] + torch.where(flip[:, None], cols_forward.flip(0)[None, :], cols_forward[None, :])

    wp = padded.shape[3]
    cropped_rows = padded.gather(2, rows[:, None, :, None].expand(n, c, h, wp))
    return cropped_rows.gather(3, cols[:, None, None, :].expand(n, c, h, w))
