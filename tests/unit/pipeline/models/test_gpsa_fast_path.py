"""The faster content path (GPSA's epoch) equals the path it replaced in float64: same weights, inputs and dropout
masks, outputs and every gradient within 1e-12 relative. Only the order of floating-point operations changed: the
score scale applied to q instead of to the scores, one (H*N, N) @ (N, D) product per image instead of H against x
broadcast, and GPSA's mix as g P + (1 - g) C instead of lerp."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from pipeline.models.content import ContentPositionSelfAttention
from pipeline.models.gpsa import GatedPositionalSelfAttention
from pipeline.models.kinds import build_attention

GRID = (4, 5)
TOLERANCE = 1e-12


def replaced_forward(layer: ContentPositionSelfAttention, x: Tensor, grid: tuple[int, int]) -> Tensor:
    """The layer's forward as it was before the fast path, written out."""
    B, N, D = x.shape  # noqa: N806
    H = layer.num_heads  # noqa: N806
    q = layer.content.query(x).view(B, N, H, D).transpose(1, 2)
    k = layer.content.key(x).view(B, N, H, D).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) * D**-0.5
    if isinstance(layer, GatedPositionalSelfAttention):
        positional = layer.attention_probs(grid)
        probs = torch.lerp(scores.softmax(dim=-1), positional, layer.gate()[:, None, None])
    else:
        probs = (layer.encoding.scores(grid)[None] + scores).softmax(dim=-1)
    probs = layer.attention_dropout(probs)
    mixed = (probs @ x[:, None]).transpose(1, 2)
    return layer.value(mixed.reshape(B, N, H * D))


def outputs_and_grads(layer: torch.nn.Module, forward, x: Tensor) -> list[Tensor]:
    layer.zero_grad()
    x = x.detach().requires_grad_(True)
    torch.manual_seed(7)  # the same attention-dropout masks for both paths
    out = forward(x)
    out.pow(2).sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in layer.parameters())]


@pytest.mark.parametrize("kind", ["gpsa", "quadratic"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_the_fast_path_equals_the_replaced_one_in_float64(kind: str, train: bool) -> None:
    torch.manual_seed(0)
    if kind == "gpsa":
        layer = build_attention("gpsa", 9, in_dim=6, max_grid=5, attention_dropout=0.1)
    else:  # the content + position layer (model.content: true) shares the content path
        layer = build_attention("quadratic", 9, in_dim=6, max_grid=5, attention_dropout=0.1, content=True)
    assert isinstance(layer, ContentPositionSelfAttention)
    layer = layer.double().train(train)
    with torch.no_grad():
        if kind == "gpsa":
            layer.gating_param.copy_(torch.randn(9))  # gates away from their init
        layer.encoding.centres.add_(torch.randn(9, 2))
    x = torch.randn(3, GRID[0] * GRID[1], 6, dtype=torch.float64)
    new = outputs_and_grads(layer, lambda v: layer(v, GRID), x)
    old = outputs_and_grads(layer, lambda v: replaced_forward(layer, v, GRID), x)
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        assert a.shape == b.shape
        assert ((a - b).abs().max() / b.abs().max()).item() <= TOLERANCE
