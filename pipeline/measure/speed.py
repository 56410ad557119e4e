"""Measuring training speed against the hardware: peak matmul FLOP/s, counted training FLOPs, peak memory.

MFU (model FLOP utilisation) = counted training FLOPs per second / the matmul FLOP/s the same device reaches in the
same process (bf16 on CUDA, fp32 on the CPU). Both numbers come from this module so that the ratio is always taken
between measurements of one machine, never against a datasheet. FLOPs follow ``pipeline.measure.counting``'s convention
(``FlopCounterMode``: 1 multiply-add = 2 FLOPs, matmuls and convolutions only), over forward *and* backward.

Nothing here asserts a speed: timings belong to ``benchmarks/``, never to tests.
"""

from __future__ import annotations

import logging
import math
import time

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from pipeline.models.generalized_quadratic import GeneralizedQuadraticEncoding
from pipeline.models.quadratic import QuadraticEncoding
from pipeline.trial.device import autocast, synchronize

log = logging.getLogger(__name__)


def matmul_peak_flops(
    device: torch.device, dtype: torch.dtype | None = None, size: int | None = None, repeats: int = 5
) -> float:
    """Best FLOP/s of a square ``size`` matmul in ``dtype`` on ``device``: the MFU denominator.

    Defaults: bf16 at 8192 on CUDA (tensor cores at a size that saturates them), fp32 at 1024 on the CPU.
    """
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    a @ b  # warm-up: kernel selection, lazy initialisation
    synchronize(device)
    inner = 10 if device.type == "cuda" else 1
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(inner):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - started) / inner)
    return 2 * size**3 / best


def count_training_flops(model: nn.Module, images: Tensor, labels: Tensor, amp_dtype: torch.dtype | None = None) -> int:
    """FLOPs of one training step's forward and backward (cross-entropy loss) on the batch ``images``.

    The optimiser update is elementwise and not counted. Gradients are cleared afterwards.
    """
    counter = FlopCounterMode(display=False)
    with counter:
        with autocast(images.device, amp_dtype):
            logits = model(images)
        F.cross_entropy(logits.float(), labels).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak memory allocated by tensors on ``device`` since the last reset; None on the CPU (not tracked)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


@torch.no_grad()
def set_gaussian_heads(model: nn.Module, alpha: float | tuple[float, float], jitter: float = 0.0, seed: int = 0) -> int:
    """Give every Gaussian head of ``model`` a trained-like shape (the paper's Fig. 3): centres on a square grid of
    shifts around the query (3x3 for 9 heads, 4x4 for 16), plus ``N(0, jitter^2)``, and width ``alpha``
    (``Sigma^-1 = 2 alpha I``): one value, or ``(low, high)`` for a log-uniform draw per head. Returns the number
    of encodings changed.

    For measuring the truncated path on heads like those of a trained model; training never calls it.
    """
    generator = torch.Generator().manual_seed(seed)
    changed = 0
    for enc in model.modules():
        if not isinstance(enc, QuadraticEncoding | GeneralizedQuadraticEncoding):
            continue
        H = enc.num_heads  # noqa: N806
        side = math.ceil(math.sqrt(H))
        offset = (side - 1) // 2
        grid = torch.tensor([[h // side - offset, h % side - offset] for h in range(H)], dtype=torch.float32)
        grid += torch.randn(H, 2, generator=generator) * jitter
        enc.centres.copy_(grid)
        if isinstance(alpha, tuple):
            low, high = math.log(alpha[0]), math.log(alpha[1])
            a = (low + (high - low) * torch.rand(H, generator=generator)).exp()
        else:
            a = torch.full((H,), float(alpha))
        spread = (2 * a).sqrt()  # alpha = s^2 / 2
        if isinstance(enc, QuadraticEncoding):
            enc.spreads.copy_(spread)
        else:
            enc.sqrt_sigma_inv.copy_(spread[:, None, None] * torch.eye(2))
        changed += 1
    return changed


__all__ = [
    "count_training_flops",
    "matmul_peak_flops",
    "peak_memory_bytes",
    "reset_peak_memory",
    "set_gaussian_heads",
]
