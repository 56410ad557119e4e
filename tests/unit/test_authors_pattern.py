"""The authors' computational pattern computes our attention's function exactly: the GPU ratio compares two ways of
computing one thing, not two things."""

from __future__ import annotations

import pytest
import torch

from benchmarks.authors_pattern import AuthorsPatternAttention, use_authors_pattern
from benchmarks.common import REDUCED_MODEL
from pipeline.config import PAPER_VARIANTS, ModelConfig
from pipeline.measure.speed import set_gaussian_heads
from pipeline.models import build_model
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import build_encoding


@pytest.mark.parametrize("encoding", ["quadratic", "generalized_quadratic"])
def test_one_layer_equals_ours_in_float64(encoding: str) -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(build_encoding(encoding, 9, max_grid=5), in_dim=6).double()
    with torch.no_grad():  # a non-isotropic, off-centre shape, so every one of the 5 features matters
        for param in ours.encoding.parameters():
            param.add_(0.3 * torch.randn_like(param))
    x = torch.randn(3, 5 * 4, 6, dtype=torch.float64)
    theirs = AuthorsPatternAttention(ours)
    torch.testing.assert_close(theirs(x, (5, 4)), ours(x, (5, 4)), rtol=0, atol=1e-12)


def test_a_whole_model_keeps_its_logits_and_learns_the_same_gradients() -> None:
    torch.manual_seed(0)
    cfg = PAPER_VARIANTS["sa_generalized_9"].apply(ModelConfig(**REDUCED_MODEL, dropout=0.0, attention_dropout=0.0))
    ours = build_model(cfg).double()
    set_gaussian_heads(ours, (1.0, 10.0), jitter=0.3)
    theirs = build_model(cfg).double()
    theirs.load_state_dict(ours.state_dict())
    assert use_authors_pattern(theirs) == cfg.layers
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    ours(images).square().sum().backward()
    theirs(images).square().sum().backward()
    torch.testing.assert_close(theirs(images), ours(images), rtol=0, atol=1e-10)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-10, msg=name)


def test_the_learned_encoding_has_no_such_pattern() -> None:
    layer = MultiHeadSelfAttention(build_encoding("learned", 9, max_grid=5), in_dim=6)
    with pytest.raises(ValueError, match="Gaussian encodings only"):
        AuthorsPatternAttention(layer)
    model = build_model(PAPER_VARIANTS["sa_learned_9"].apply(ModelConfig(**REDUCED_MODEL)))
    assert use_authors_pattern(model) == 0
