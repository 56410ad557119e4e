"""Where each attention head looks, measured in the trial at every epoch from each layer's own input.

Three numbers per head, from the probabilities ``p`` the layer applies (``MultiHeadSelfAttention.probs_for``), each
averaged over the queries (and over the images, when the probabilities depend on the content):

- **mean distance**: ``sum_k p(k) ||key - query||`` in tokens of the attention grid, the "mean attention distance"
  of ViT (Dosovitskiy et al. 2021, Fig. 7) and ConViT: how far a head looks.
- **entropy**: ``-sum_k p(k) log p(k)`` in nats: 0 for a head on one key, ``log N`` for a uniform head.
- **peak probability**: ``max_k p(k)``, over the interior queries (at least ``margin`` tokens from every border, where
  every nearby shift exists; all queries when the grid has no interior): 1 for Lemma 1's convolution-like head, which
  attends to one shift with probability 1.

**What an attention kind reports.** Beside these three, a layer reports the per-head quantities its registry entry
declares (``head_report``, ``pipeline.encodings``), e.g. ConViT's gate and centre distance: they join the layer's
per-head history and the epoch's report per head, as ``locality/layer<l>/head<h>/<name>``.

**Each layer's real input.** A forward pre-hook on every attention layer asks it for the probabilities of the input it
actually receives, during one eval-mode forward pass over a fixed batch (the first ``LOCALITY_BATCH`` test images, the
same at every epoch and after a resume). The paper's attention reads positions only, so any input gives the same
numbers; an attention that reads the content is measured as it runs, and feeding every layer the first layer's input
would measure another network (the unit tests build such an attention to show the difference).

**Cost.** One forward pass of ``LOCALITY_BATCH`` images plus O(H N^2) per layer for the metrics, once per epoch: at
the paper's size (CIFAR-10, 50,000 training images of 32x32, 6 layers x 9 heads) that is well under 0.1 % of an
epoch's training (measured in ``docs/study.md``). Eval mode, no gradients, no random draws: training and its resumed
RNG streams are untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import relative_offsets
from pipeline.trial.report import LOCALITY_METRICS, locality_key

LOCALITY_BATCH = 32  # images of the fixed evaluation batch: plenty for content-dependent attention, cheap at any size
PEAK_MARGIN = 2  # tokens from the border of a query whose peak probability counts (a 5x5 neighbourhood fits inside)


def interior_queries(grid: tuple[int, int], margin: int, device: torch.device | None = None) -> Tensor:
    """Boolean (N,) mask of the queries at least ``margin`` tokens from every border (row-major); all queries when
    the grid has no interior."""
    rows, cols = grid
    r, c = torch.meshgrid(torch.arange(rows, device=device), torch.arange(cols, device=device), indexing="ij")
    inside = ((r >= margin) & (r < rows - margin) & (c >= margin) & (c < cols - margin)).flatten()
    return inside if inside.any() else torch.ones_like(inside)


def head_locality(probs: Tensor, grid: tuple[int, int], margin: int = PEAK_MARGIN) -> dict[str, Tensor]:
    """Per head (H,) float64 tensors ``mean_distance``, ``entropy``, ``peak_probability`` of attention probabilities
    ``probs``: (H, N, N) shared by every image, or (B, H, N, N) per image (averaged over the images)."""
    p = probs.detach().double()
    p = p[None] if p.dim() == 3 else p  # (B, H, N, N)
    distance = relative_offsets(*grid, device=p.device).double().norm(dim=-1)  # (N, N) tokens between query and key
    entropy = -torch.special.xlogy(p, p).sum(-1)  # (B, H, N); 0 log 0 = 0
    interior = interior_queries(grid, margin, p.device)
    return {
        "mean_distance": (p * distance).sum(-1).mean(dim=(0, 2)),
        "entropy": entropy.mean(dim=(0, 2)),
        "peak_probability": p.amax(-1)[..., interior].mean(dim=(0, 2)),
    }


def attention_layers(model: nn.Module) -> list[MultiHeadSelfAttention]:
    """The model's attention layers, in forward order (none for a ResNet)."""
    return [m for m in model.modules() if isinstance(m, MultiHeadSelfAttention)]


@torch.no_grad()
def measure_locality(model: nn.Module, images: Tensor) -> list[dict[str, list[float]]] | None:
    """Per attention layer, each head's metrics (lists of H floats; empty for a layer pruned to no heads), measured
    on the input each layer receives when ``model`` (in eval mode) runs on normalised ``images`` (B, C, H, W).
    None for a model without attention."""
    layers = attention_layers(model)
    if not layers:
        return None
    measured: dict[int, dict[str, list[float]]] = {}

    def measure(layer: MultiHeadSelfAttention, args: tuple[Any, ...]) -> None:
        x, grid = args  # the layer's own input (B, N, D) and token grid, as forward receives them
        if layer.num_heads == 0:
            measured[id(layer)] = {name: [] for name in LOCALITY_METRICS}
            return
        values = {**head_locality(layer.probs_for(x, grid), grid), **layer.head_report()}
        measured[id(layer)] = {name: values[name].double().tolist() for name in values}

    hooks = [layer.register_forward_pre_hook(measure) for layer in layers]
    training = model.training
    try:
        model.eval()
        model(images)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(training)
    return [measured[id(layer)] for layer in layers]


def layer_summary(per_layer: list[dict[str, list[float]]]) -> dict[str, float]:
    """The per-epoch report's locality metrics: each layer's mean over its heads, as ``locality/layer<l>/<metric>``
    (layers from 1, as everywhere a person reads them; a layer without heads has none), and each head's reported
    quantities (``head_report``) as ``locality/layer<l>/head<h>/<name>`` (heads from 1)."""
    means = {
        locality_key(index, name): sum(values[name]) / len(values[name])
        for index, values in enumerate(per_layer, start=1)
        for name in LOCALITY_METRICS
        if values[name]
    }
    per_head = {
        locality_key(index, f"head{head}/{name}"): value
        for index, values in enumerate(per_layer, start=1)
        for name in values
        if name not in LOCALITY_METRICS
        for head, value in enumerate(values[name], start=1)
    }
    return means | per_head


__all__ = [
    "LOCALITY_BATCH",
    "PEAK_MARGIN",
    "attention_layers",
    "head_locality",
    "interior_queries",
    "layer_summary",
    "measure_locality",
]
