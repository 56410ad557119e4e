"""Content scores added to the positional ones (``model.content``): zero query/key weights give back the paper's
position-only attention exactly, and any other weights make each image's probabilities its own."""

from __future__ import annotations

import pytest
import torch

from pipeline.encodings import positional_encodings
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.content import ContentPositionSelfAttention, ContentScores
from pipeline.models.positional import build_encoding

GRID = (4, 4)


def _layer(name: str) -> ContentPositionSelfAttention:
    torch.manual_seed(0)
    return ContentPositionSelfAttention(build_encoding(name, 3, max_grid=4, learned_dim=5), in_dim=6).double().eval()


@pytest.mark.parametrize("name", positional_encodings())
def test_zero_query_key_weights_make_content_vanish(name: str) -> None:
    layer = _layer(name)
    with torch.no_grad():
        layer.content.query.weight.zero_()
        layer.content.key.weight.zero_()
    x = torch.randn(2, 16, 6, dtype=torch.float64)
    assert layer.content(x).abs().max() == 0
    plain = MultiHeadSelfAttention(layer.encoding, 6).double().eval()
    plain.value.load_state_dict(layer.value.state_dict())
    assert (layer.probs_for(x, GRID) - plain.attention_probs(GRID)[None]).abs().max() <= 1e-12
    assert (layer(x, GRID) - plain(x, GRID)).abs().max() <= 1e-12


@pytest.mark.parametrize("name", positional_encodings())
def test_content_makes_probabilities_per_image(name: str) -> None:
    layer = _layer(name)
    x = torch.randn(2, 16, 6, dtype=torch.float64)
    probs = layer.probs_for(x, GRID)
    assert probs.shape == (2, 3, 16, 16)
    assert (probs[0] - probs[1]).abs().max() > 1e-4


def test_scores_are_scaled_dot_products_at_the_heads_width() -> None:
    scores = ContentScores(2, 3).double()
    x = torch.randn(1, 4, 3, dtype=torch.float64)
    q = scores.query(x).view(1, 4, 2, 3)[0, :, 1]  # head 1's queries, (N, D)
    k = scores.key(x).view(1, 4, 2, 3)[0, :, 1]
    assert torch.allclose(scores(x)[0, 1], q @ k.T / 3**0.5)


def test_pruning_keeps_the_other_heads_probabilities() -> None:
    layer = _layer("learned")
    x = torch.randn(2, 16, 6, dtype=torch.float64)
    before = layer.probs_for(x, GRID)[:, [0, 2]]
    layer.prune_heads([0, 2])
    assert (layer.probs_for(x, GRID) - before).abs().max() <= 1e-12
