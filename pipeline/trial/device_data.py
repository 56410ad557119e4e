"""The prepared dataset on the trial's device: moved there once, images kept uint8 until a batch is drawn.

Its own module so that the training loop and the whole-step CUDA graph (``whole_step``), which the loop builds, both
read it without importing each other; the fine-tune recipes and the analysis build it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pipeline.trial.locality import LOCALITY_BATCH

if TYPE_CHECKING:
    from pipeline.data.prepared import PreparedData

__all__ = ["DeviceData"]


@dataclass(frozen=True)
class DeviceData:
    """The prepared dataset moved once to the training device; images stay uint8 until a batch is drawn."""

    train_images: Tensor  # uint8 (N, C, H, W)
    train_labels: Tensor  # int64 (N,)
    test_images: Tensor  # uint8 (M, C, H, W)
    test_labels: Tensor  # int64 (M,)
    mean: Tensor  # (1, C, 1, 1), for images / 255
    std: Tensor  # (1, C, 1, 1)
    val_images: Tensor | None = None  # uint8 (V, C, H, W), when the prepared data has a validation set
    val_labels: Tensor | None = None  # int64 (V,)

    @classmethod
    def from_prepared(cls, data: PreparedData, device: torch.device) -> DeviceData:
        stats = [torch.tensor(s, dtype=torch.float32, device=device).view(1, -1, 1, 1) for s in (data.mean, data.std)]
        validation = [None, None] if data.val_images is None else [data.val_images, data.val_labels]
        return cls(
            data.train_images.to(device),
            data.train_labels.to(device),
            data.test_images.to(device),
            data.test_labels.to(device),
            *stats,
            *(None if t is None else t.to(device) for t in validation),
        )

    def normalise(self, images: Tensor) -> Tensor:  # float (B, C, H, W) in [0, 1] -> standardised
        return (images - self.mean) / self.std

    def locality_batch(self) -> Tensor:
        """The fixed batch locality is measured on: the first ``LOCALITY_BATCH`` test images, normalised."""
        return self.normalise(self.test_images[:LOCALITY_BATCH].float().div(255))  # (B, C, H, W)
