"""ConViT's gated positional self-attention: its local init is ConViT's, and with the gate forced to 1 it is exactly the
paper's quadratic attention with the same centres and spreads."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.gpsa import GatedPositionalSelfAttention, local_init_centres
from pipeline.models.kinds import build_attention
from pipeline.models.positional import relative_offsets
from pipeline.models.quadratic import QuadraticEncoding

GRID = (5, 5)


def _gpsa(heads: int = 9, dim: int = 6, **kwargs: float) -> GatedPositionalSelfAttention:
    torch.manual_seed(0)
    layer = build_attention("gpsa", heads, in_dim=dim, max_grid=5, **kwargs).double().eval()
    assert isinstance(layer, GatedPositionalSelfAttention)
    return layer


def _quadratic_twin(gpsa: GatedPositionalSelfAttention) -> MultiHeadSelfAttention:
    """The paper's attention layer with GPSA's centres, spreads and value weights."""
    encoding = QuadraticEncoding(gpsa.num_heads).double()
    plain = MultiHeadSelfAttention(encoding, gpsa.in_dim).double().eval()
    plain.load_state_dict({k: v for k, v in gpsa.state_dict().items() if k.startswith(("encoding.", "value."))})
    return plain


def test_gate_forced_to_one_is_the_quadratic_attention_exactly() -> None:
    gpsa = _gpsa()
    with torch.no_grad():
        gpsa.gating_param.fill_(1e3)  # sigma(1000) == 1.0 in float64
        gpsa.encoding.centres.add_(torch.randn(9, 2))  # any centres and spreads, not only the init's
        gpsa.encoding.spreads.mul_(torch.rand(9) + 0.5)
    plain = _quadratic_twin(gpsa)
    x = torch.randn(3, 25, 6, dtype=torch.float64)
    probs = gpsa.probs_for(x, GRID)  # (B, H, N, N)
    assert (probs - plain.attention_probs(GRID)[None]).abs().max() <= 1e-12
    assert (gpsa(x, GRID) - plain(x, GRID)).abs().max() <= 1e-12


def test_at_init_the_gate_mixes_in_content() -> None:
    """The check above can fail: at ConViT's init (lambda = 1, gate 0.73) the layer is not the quadratic one."""
    gpsa = _gpsa()
    assert torch.allclose(gpsa.gate(), torch.full((9,), 1 / (1 + math.exp(-1.0)), dtype=torch.float64))
    x = torch.randn(3, 25, 6, dtype=torch.float64)
    assert (gpsa.probs_for(x, GRID) - _quadratic_twin(gpsa).attention_probs(GRID)[None]).abs().max() > 1e-3
    assert torch.allclose(gpsa.probs_for(x, GRID).sum(-1), torch.ones(3, 9, 25, dtype=torch.float64))


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_local_init_is_convits(alpha: float) -> None:
    """ConViT's ``local_init`` written out: ``pos_proj`` weights on (dx, dy, dx^2 + dy^2), head ``h1 + k h2`` with
    ``(2 (h2 - c) alpha, 2 (h1 - c) alpha, -alpha)``; its softmax equals this layer's positional probabilities."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # initialise in float64: sqrt(2 alpha) in float32 is off by ~1e-8
    try:
        gpsa = _gpsa(locality_strength=alpha)
    finally:
        torch.set_default_dtype(default)
    k, c = 3, 1
    delta = relative_offsets(*GRID).double()  # (N, N, 2): row shift, column shift
    rel = torch.stack([delta[..., 1], delta[..., 0], delta.square().sum(-1)], dim=-1)  # ConViT's (indx, indy, indd)
    weight = torch.zeros(9, 3, dtype=torch.float64)
    for h1 in range(k):
        for h2 in range(k):
            weight[h1 + k * h2] = torch.tensor([2.0 * (h2 - c), 2.0 * (h1 - c), -1.0], dtype=torch.float64) * alpha
    convit = (rel @ weight.T).permute(2, 0, 1).softmax(-1)  # (H, N, N)
    assert (gpsa.attention_probs(GRID) - convit).abs().max() <= 1e-12


def test_local_init_grid_and_the_heads_beyond_it() -> None:
    assert local_init_centres(9).tolist() == [[r, c] for c in (-1, 0, 1) for r in (-1, 0, 1)]
    assert local_init_centres(16).unique().tolist() == [-1.5, -0.5, 0.5, 1.5]  # even k: ConViT's half-integer middle
    gpsa = _gpsa(heads=10)
    assert torch.equal(gpsa.encoding.centres[:9], local_init_centres(9).double())  # the 10th keeps a random centre


def test_head_report_and_pruning() -> None:
    gpsa = _gpsa()
    with torch.no_grad():
        gpsa.gating_param.copy_(torch.linspace(-2, 2, 9))
    report = gpsa.head_report()
    assert torch.allclose(report["gate"], torch.sigmoid(torch.linspace(-2, 2, 9, dtype=torch.float64)))
    assert torch.allclose(report["centre_distance"], local_init_centres(9).double().norm(dim=-1))
    x = torch.randn(2, 25, 6, dtype=torch.float64)
    keep = [0, 4, 8]
    before = gpsa.probs_for(x, GRID)[:, keep]
    gpsa.prune_heads(keep)
    assert gpsa.num_heads == 3 and gpsa.gating_param.shape == (3,)
    assert (gpsa.probs_for(x, GRID) - before).abs().max() <= 1e-12
