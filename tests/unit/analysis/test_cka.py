"""Linear CKA: 1 for a representation and itself, invariant to orthogonal transforms and isotropic scaling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.cka import centred_gram, cka_matrix, layer_grams, linear_cka, representations
from pipeline.config import ModelConfig
from pipeline.models import build_model


def _features(n: int = 50, p: int = 20, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_representation_with_itself_is_one() -> None:
    x = _features()
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x.view(50, 4, 5), x) == pytest.approx(1.0, abs=1e-12)  # per-image features are flattened


def test_invariant_to_orthogonal_transforms_and_isotropic_scaling() -> None:
    x, y = _features(), _features(p=30, seed=1)
    q, _ = torch.linalg.qr(_features(n=20, p=20, seed=2))  # a random orthogonal 20 x 20
    reference = linear_cka(x, y)
    assert linear_cka(x @ q, y) == pytest.approx(reference, abs=1e-12)
    assert linear_cka(7.5 * x, 0.01 * y) == pytest.approx(reference, abs=1e-12)
    assert linear_cka(x @ q * 3.0, y) == pytest.approx(reference, abs=1e-12)


def test_not_invariant_to_any_linear_map_and_low_for_unrelated_features() -> None:
    """The checks above can fail: an anisotropic scaling changes CKA, and independent features score far below 1."""
    x, y = _features(), _features(p=30, seed=1)
    stretch = torch.diag(torch.linspace(0.1, 10.0, 20, dtype=torch.float64))
    assert abs(linear_cka(x @ stretch, y) - linear_cka(x, y)) > 1e-3
    assert linear_cka(x, _features(seed=3)) < 0.6


def test_matrix_matches_the_pairwise_values() -> None:
    rows, columns = [_features(seed=s) for s in (0, 1)], [_features(p=7, seed=s) for s in (2, 3, 4)]
    matrix = cka_matrix([centred_gram(r) for r in rows], [centred_gram(c) for c in columns])
    assert matrix.shape == (2, 3)
    assert np.allclose(matrix, [[linear_cka(r, c) for c in columns] for r in rows], atol=1e-12)


@pytest.mark.parametrize("arch", ["sa", "resnet18", "t_resnet18"])
def test_representations_of_each_kind_of_model(arch: str) -> None:
    model = build_model(ModelConfig(arch=arch, hidden=8, ffn=8, layers=2, resnet_width=4, downsample=1), image_size=8)
    names, modules = representations(model)
    grams = layer_grams(model, modules, torch.randn(6, 3, 8, 8))
    assert len(names) == len(grams) == (2 if arch == "sa" else 5)
    assert all(gram.shape == (6, 6) for gram in grams)
    assert cka_matrix(grams, grams).diagonal() == pytest.approx([1.0] * len(grams))
