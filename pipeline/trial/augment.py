"""Random crops and flips, drawn on the CPU and applied on the images' device.

Its own module so that the training loop and the whole-step CUDA graph (``whole_step``), which the loop builds, both
apply the same augmentation without importing each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

__all__ = ["augment_batch", "draw_augmentation", "apply_augmentation"]


def augment_batch(images: Tensor, padding: int, generator: torch.Generator, *, hflip: bool = True) -> Tensor:
    """Standard CIFAR augmentation, batched: per image, a random crop after zero padding and a random flip.

    ``images`` (B, C, H, W) in [0, 1], before normalisation, so padding is black like torchvision's
    ``RandomCrop(padding=p)`` on the raw image. Random draws come from ``generator`` (on the CPU, so CPU and
    GPU runs see the same crops); the result has the input's shape and device.
    """
    offsets, flips = draw_augmentation([len(images)], padding, generator, hflip=hflip)
    return apply_augmentation(images, padding, offsets.to(images.device), flips.to(images.device))


def draw_augmentation(
    sizes: list[int], padding: int, generator: torch.Generator, *, hflip: bool = True
) -> tuple[Tensor, Tensor]:
    """The crops and flips of consecutive batches of ``sizes``, drawn at once: (2, sum(sizes)) offsets, (sum,) flips.

    The draws are made batch by batch in the order ``augment_batch`` makes them (the crops, then the flips, of each
    batch), so drawing an epoch's at its start gives the same numbers as drawing each batch's before it, and moving
    them to the device once spares every step a host-to-device copy. Without padding the offsets are zero, without
    ``hflip`` no image is flipped; neither then draws.
    """
    offsets, flips = [], []
    for size in sizes:
        if padding > 0:
            offsets.append(torch.randint(0, 2 * padding + 1, (2, size), generator=generator))  # (2, B)
        if hflip:
            flips.append(torch.rand(size, generator=generator) < 0.5)  # (B,)
    n = sum(sizes)
    return (
        torch.cat(offsets, dim=1) if offsets else torch.zeros(2, n, dtype=torch.int64),
        torch.cat(flips) if flips else torch.zeros(n, dtype=torch.bool),
    )


def apply_augmentation(images: Tensor, padding: int, offsets: Tensor, flips: Tensor) -> Tensor:
    """``images`` (B, C, H, W) cropped at ``offsets`` (2, B) of the zero-padded images and flipped where ``flips``
    (B,), all on the images' device (no draw, no host sync: a captured step can run it)."""
    B, C, H, W = images.shape  # noqa: N806
    device = images.device
    if padding > 0:
        padded = F.pad(images, (padding, padding, padding, padding))  # (B, C, H + 2p, W + 2p)
        rows = offsets[0, :, None] + torch.arange(H, device=device)  # (B, H)
        cols = offsets[1, :, None] + torch.arange(W, device=device)  # (B, W)
        batch = torch.arange(B, device=device)[:, None, None, None]
        channel = torch.arange(C, device=device)[None, :, None, None]
        images = padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)
    return torch.where(flips[:, None, None, None], images.flip(-1), images)
