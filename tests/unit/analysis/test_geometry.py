"""Head geometry against closed forms: contour radii and mass, attention distance of one-hot and uniform heads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis.geometry import (
    HEADS_COLUMNS,
    distance_to_integer_shift,
    gaussian_contour,
    heads_frame,
    history_frame,
    locality_frame,
    mahalanobis_radius,
    mean_attention_distance,
    peak_probability,
    probs_from_geometry,
)
from pipeline.config import PAPER_VARIANTS, ModelConfig
from pipeline.models import build_model
from pipeline.models.positional import relative_offsets
from pipeline.trial.checkpoint import head_snapshot
from pipeline.trial.locality import measure_locality

SIGMA = np.array([[4.0, 1.2], [1.2, 1.0]])  # a tilted, anisotropic covariance
CENTRE = np.array([1.5, -2.0])


@pytest.mark.parametrize("mass", [0.5, 0.9])
def test_contour_points_lie_at_the_chi_square_radius(mass: float) -> None:
    points = gaussian_contour(CENTRE, np.linalg.inv(SIGMA), mass)
    assert points is not None and points.shape == (100, 2)
    diff = points - CENTRE
    radius = np.sqrt(np.einsum("ki,ij,kj->k", diff, np.linalg.inv(SIGMA), diff))
    np.testing.assert_allclose(radius, math.sqrt(-2 * math.log(1 - mass)), rtol=1e-10)


@pytest.mark.parametrize("mass", [0.5, 0.9])
def test_the_contour_holds_its_mass(mass: float) -> None:
    """Monte Carlo: the fraction of samples inside the polygon is ``mass`` (matplotlib's point-in-polygon)."""
    from matplotlib.path import Path

    points = gaussian_contour(CENTRE, np.linalg.inv(SIGMA), mass, num_points=400)
    samples = np.random.default_rng(0).multivariate_normal(CENTRE, SIGMA, size=200_000)
    inside = Path(points).contains_points(samples).mean()
    assert abs(inside - mass) < 0.005  # 4.5 sigma of the binomial at n = 200k, plus the polygon's inscribed error


def test_radius_is_the_chi_square_quantile() -> None:
    assert mahalanobis_radius(0.5) == pytest.approx(math.sqrt(2 * math.log(2)))
    with pytest.raises(ValueError):
        mahalanobis_radius(1.0)


def test_flat_or_broken_heads_have_no_contour() -> None:
    assert gaussian_contour([0, 0], np.zeros((2, 2)), 0.5) is None
    assert gaussian_contour([0, 0], [[1.0, 0.0], [0.0, 0.0]], 0.9) is None  # flat along columns
    assert gaussian_contour([0, float("nan")], np.eye(2), 0.5) is None


def _one_hot_head(grid: tuple[int, int], shift: tuple[int, int]) -> torch.Tensor:
    """(1, N, N): every query attends to ``query + shift`` (or to itself where that falls off the grid)."""
    delta = relative_offsets(*grid)  # (N, N, 2)
    hit = (delta == torch.tensor(shift)).all(-1).float()  # (N, N)
    hit[hit.sum(-1) == 0] = torch.eye(grid[0] * grid[1])[hit.sum(-1) == 0]
    return hit[None]


@pytest.mark.parametrize("shift", [(1, 0), (-2, 1), (2, 2), (0, 0)])
def test_one_hot_head_distance_is_its_shift_length(shift: tuple[int, int]) -> None:
    grid = (9, 9)
    probs = _one_hot_head(grid, shift)
    per_query = (probs * relative_offsets(*grid).double().norm(dim=-1)).sum(-1)  # (1, N)
    interior = per_query.reshape(grid)[2:-2, 2:-2]
    np.testing.assert_allclose(interior.numpy(), math.hypot(*shift))
    # The full average only differs through the border queries that fell back to themselves.
    assert mean_attention_distance(probs, grid)[0] <= math.hypot(*shift) + 1e-12
    assert mean_attention_distance(probs, grid, token_size=2)[0] == pytest.approx(
        2 * mean_attention_distance(probs, grid)[0]
    )
    assert peak_probability(probs, grid)[0] == pytest.approx(1.0)


def test_uniform_head_distance_is_the_grids_mean_pairwise_distance() -> None:
    grid = (4, 5)
    n = grid[0] * grid[1]
    probs = torch.full((2, n, n), 1.0 / n)
    pos = np.array([(r, c) for r in range(grid[0]) for c in range(grid[1])], dtype=float)
    pairwise = np.linalg.norm(pos[:, None] - pos[None], axis=-1).mean()  # brute force, independent of the code
    np.testing.assert_allclose(mean_attention_distance(probs, grid), [pairwise, pairwise])
    np.testing.assert_allclose(peak_probability(probs, grid), 1.0 / n)


def test_distance_to_integer_shift() -> None:
    np.testing.assert_allclose(distance_to_integer_shift([[0.5, 0.0], [1.0, -2.0], [0.3, 0.4]]), [0.5, 0.0, 0.5])


def test_probs_from_geometry_match_the_models_own() -> None:
    torch.manual_seed(0)
    cfg = PAPER_VARIANTS["sa_generalized_9"].apply(ModelConfig(hidden=8, layers=1, ffn=8))
    model = build_model(cfg, image_size=12)
    geometry = model.head_geometry()[0]
    expected = model.layers[0].attention.attention_probs(model.grid)
    got = probs_from_geometry(geometry["centres"], geometry["sigma_inv"], model.grid)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["sa_quadratic_9", "sa_generalized_9", "sa_learned_9"])
def test_heads_frame_of_a_real_model(variant: str) -> None:
    torch.manual_seed(0)
    cfg = PAPER_VARIANTS[variant].apply(ModelConfig(hidden=8, layers=3, ffn=8, learned_dim=4))
    model = build_model(cfg, image_size=16)
    frame = heads_frame(model)
    assert list(frame.columns) == HEADS_COLUMNS
    assert len(frame) == 3 * 9  # the variant sets 9 heads per layer
    assert frame[["layer", "head"]].drop_duplicates().shape[0] == 27
    assert frame["layer"].tolist()[::9] == [1, 2, 3] and frame["head"].tolist()[:9] == list(range(1, 10))
    assert frame["peak_probability"].between(0, 1).all()
    assert (frame["mean_distance_px"] == 2 * frame["mean_distance"]).all()
    if variant == "sa_learned_9":
        assert frame["centre_row"].isna().all() and frame["distance_to_integer_shift"].isna().all()
    else:
        centres = model.head_geometry()[1]["centres"]
        layer2 = frame[frame["layer"] == 2]
        np.testing.assert_allclose(layer2[["centre_row", "centre_col"]].to_numpy(), centres.numpy(), rtol=1e-6)
        assert (frame["eig_min"] <= frame["eig_max"]).all()
    # The trial's own measurement, when given, is what the frame shows (here the same numbers: position-only).
    measured = measure_locality(model, torch.randn(2, 3, 16, 16))
    given = heads_frame(model, measured)
    np.testing.assert_allclose(given["entropy"], frame["entropy"], rtol=1e-9)
    assert given.loc[10, "mean_distance"] == measured[1]["mean_distance"][1]


def test_pruned_model_frame_has_one_row_per_remaining_head() -> None:
    cfg = PAPER_VARIANTS["sa_generalized_9"].apply(ModelConfig(hidden=8, layers=2, ffn=8))
    model = build_model(cfg, image_size=8)
    model.prune_heads([[0, 2], [1]])
    assert heads_frame(model).groupby("layer").size().tolist() == [2, 1]


def test_history_frames() -> None:
    cfg = PAPER_VARIANTS["sa_quadratic_9"].apply(ModelConfig(hidden=8, layers=2, ffn=8))
    model = build_model(cfg, image_size=8)
    history = [head_snapshot(model, 0), head_snapshot(model, 1)]
    frame = history_frame(history)
    assert len(frame) == 2 * 2 * 9 and set(frame["epoch"]) == {0, 1} and set(frame["layer"]) == {1, 2}
    assert history_frame([]).empty
    images = torch.randn(2, 3, 8, 8)
    locality = [{"epoch": e, "layers": measure_locality(model, images)} for e in (0, 1)]
    rows = locality_frame(locality)
    assert len(rows) == 2 * 2 * 9 and rows["head"].min() == 1 and rows["layer"].max() == 2
    expected = mean_attention_distance(model.layers[1].attention.attention_probs(model.grid), model.grid)
    layer2 = rows.query("epoch == 1 and layer == 2")["mean_distance"].to_numpy()
    np.testing.assert_allclose(layer2, expected, rtol=1e-12)
    assert locality_frame([]).empty
