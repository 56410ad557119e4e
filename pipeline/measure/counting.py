"""Exact parameter counts and per-image FLOPs, each FLOP number labelled with its convention.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``, which counts 2 FLOPs per multiply-accumulate of
matmuls and convolutions (elementwise ops, softmax and norms are not counted). Two conventions are reported:

- ``paper``: 2 x MACs of the Linear and Conv layers applied to the image / tokens only (the convention behind the
  paper's 6.2B / 1.1B). The attention-weighted sums ``softmax(scores) @ X`` are not counted, nor are the learned
  encoding's ``Linear(dim, H)`` on its shift tables, which do not scale with the image.
- ``full``: every matmul / convolution FlopCounterMode sees in one forward pass of one image, attention-weighted
  sums included (about 9.0B for SA quadratic 9 heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pipeline.models.positional import PositionalEncoding

MAC_CONVENTION = "1 multiply-add = 2 FLOPs"


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs for one image, in both conventions (see module docstring)."""

    paper: int
    full: int
    convention: str = MAC_CONVENTION


def count_parameters(model: nn.Module) -> int:
    """Every parameter, trainable or not (the paper's counts include all of them)."""
    return sum(p.numel() for p in model.parameters())


def _counted_modules(model: nn.Module) -> list[str]:
    """Qualified names of the Linear / Conv layers that the paper's convention counts."""
    inside_encoding = {
        f"{enc_name}.{sub}" if sub else enc_name
        for enc_name, enc in model.named_modules()
        if isinstance(enc, PositionalEncoding)
        for sub, _ in enc.named_modules()
    }
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d) and name not in inside_encoding
    ]


@torch.no_grad()
def count_flops(model: nn.Module, image_shape: tuple[int, int, int] = (3, 32, 32)) -> FlopCount:
    """Forward FLOPs of ``model`` on one image of ``image_shape`` (C, H, W), in eval mode."""
    was_training = model.training
    model.eval()
    param = next(model.parameters())
    image = torch.zeros(1, *image_shape, dtype=param.dtype, device=param.device)
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            model(image)
    finally:
        model.train(was_training)
    per_module = counter.get_flop_counts()
    root = type(model).__name__
    paper = sum(sum(per_module.get(f"{root}.{name}", {}).values()) for name in _counted_modules(model))
    return FlopCount(paper=int(paper), full=int(counter.get_total_flops()))
