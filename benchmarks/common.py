"""What the speed benchmarks share: CIFAR-10-shaped synthetic data on the device and the reduced CPU model size.

Throughput does not depend on what the pixels show, so the speed benchmarks train on uniformly random uint8 images
with random labels, held on the device exactly as the trainer holds a prepared dataset (``DeviceData``). Figures of
accuracy or loss never come from this data.
"""

from __future__ import annotations

import torch

from pipeline.datasets import CIFAR10_MEAN, CIFAR10_STD
from pipeline.train import DeviceData

# Paper-size models take ~1 s per step on a 2-core CPU; on the CPU the benchmarks shrink widths and depth (16x16
# tokens stay, as in the paper) so that they finish in minutes and show only that they run.
REDUCED_MODEL = {"hidden": 64, "layers": 2, "ffn": 128, "learned_dim": 64, "resnet_width": 16}


def synthetic_device_data(
    device: torch.device, n_train: int, n_test: int, generator: torch.Generator, image_size: int = 32
) -> DeviceData:
    """Random CIFAR-10-shaped uint8 images and labels in [0, 10), on ``device``, with CIFAR-10's normalisation."""

    def images(n: int) -> torch.Tensor:
        shape = (n, 3, image_size, image_size)
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).to(device)

    def labels(n: int) -> torch.Tensor:
        return torch.randint(0, 10, (n,), generator=generator).to(device)

    stats = [torch.tensor(s, device=device).view(1, 3, 1, 1) for s in (CIFAR10_MEAN, CIFAR10_STD)]
    return DeviceData(images(n_train), labels(n_train), images(n_test), labels(n_test), *stats)
