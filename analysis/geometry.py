"""Where each attention head looks, as numbers: Gaussian contours, attention distance, convolution-likeness.

Coordinates are ``(row, col)`` shifts ``delta = key - query`` in tokens of the attention grid (one token is
``downsample`` pixels of the image wide, so pixels = tokens x downsample). Every probability comes from the
model's own ``attention_probs`` and every centre / ``Sigma^-1`` from its ``head_geometry``, so the analysis and
the training code share one definition of each quantity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import GeneralizedQuadraticEncoding, relative_offsets
from pipeline.models.sa_net import SelfAttentionNet

# Below this precision eigenvalue (1 / token^2) a head is flat along that axis: its contour is wider than
# 1e4 tokens, so "no finite contour" is the honest answer.
MIN_PRECISION = 1e-8


def mahalanobis_radius(mass: float) -> float:
    """Radius r with P(||z|| <= r) = mass for a standard 2D Gaussian (chi-square with 2 dof): sqrt(-2 ln(1 - mass))."""
    if not 0.0 < mass < 1.0:
        raise ValueError(f"mass must be in (0, 1), got {mass}")
    return math.sqrt(-2.0 * math.log1p(-mass))


def gaussian_contour(
    centre: Sequence[float] | np.ndarray | Tensor,
    sigma_inv: Sequence[Sequence[float]] | np.ndarray | Tensor,
    mass: float,
    num_points: int = 100,
) -> np.ndarray | None:
    """The ellipse holding ``mass`` of N(centre, Sigma), as (num_points, 2) ``(row, col)`` points (closed: the
    last point repeats the first), or None when ``sigma_inv`` is singular (a flat head has no finite contour)."""
    centre_arr = np.asarray(centre, dtype=float).reshape(2)
    precision = np.asarray(sigma_inv, dtype=float).reshape(2, 2)
    precision = 0.5 * (precision + precision.T)  # symmetric by construction; remove float noise
    if not np.isfinite(precision).all() or not np.isfinite(centre_arr).all():
        return None
    eigvals, eigvecs = np.linalg.eigh(precision)  # Sigma^-1 = V diag(lam) V^T
    if eigvals.min() <= MIN_PRECISION:
        return None
    angle = np.linspace(0.0, 2.0 * np.pi, num_points)
    circle = np.stack([np.cos(angle), np.sin(angle)], axis=-1)  # (K, 2), unit Mahalanobis radius
    # x = centre + r V diag(lam^-1/2) u  gives  (x - c)^T Sigma^-1 (x - c) = r^2
    return centre_arr + mahalanobis_radius(mass) * (circle / np.sqrt(eigvals)) @ eigvecs.T


def _as_probs(probs: Tensor | np.ndarray) -> Tensor:
    return torch.as_tensor(probs, dtype=torch.float64).detach().cpu()


def query_key_distance(grid: tuple[int, int]) -> Tensor:
    """Euclidean distance in tokens between query and key, (N, N), from the models' own relative offsets."""
    return relative_offsets(*grid).double().norm(dim=-1)


def mean_attention_distance(probs: Tensor | np.ndarray, grid: tuple[int, int], token_size: float = 1.0) -> np.ndarray:
    """Per head, E[||key - query||] under the head's attention, averaged over all queries: (H, N, N) -> (H,).

    The measure ViT papers use for "how far a head looks". Units: tokens of the attention grid times
    ``token_size`` (pass the model's ``downsample`` to get image pixels).
    """
    p = _as_probs(probs)  # (H, N, N)
    per_query = (p * query_key_distance(grid)).sum(-1)  # (H, N)
    return (per_query.mean(-1) * token_size).numpy()


def interior_queries(grid: tuple[int, int], margin: int) -> Tensor:
    """Boolean (N,) mask of queries at least ``margin`` tokens from every border (row-major order)."""
    rows, cols = grid
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    inside = (r >= margin) & (r < rows - margin) & (c >= margin) & (c < cols - margin)
    return inside.flatten()


def peak_probability(probs: Tensor | np.ndarray, grid: tuple[int, int], margin: int = 2) -> np.ndarray:
    """Per head, the largest attention probability of a query, averaged over interior queries: (H,).

    Lemma 1's convolution-like head attends with probability ~1 to one shift; near the border that shift can
    fall off the grid, so queries closer than ``margin`` tokens to a border are left out (all queries are used
    when the grid is too small to have an interior).
    """
    p = _as_probs(probs)  # (H, N, N)
    mask = interior_queries(grid, margin)
    if not mask.any():
        mask = torch.ones_like(mask)
    return p.amax(-1)[:, mask].mean(-1).numpy()


def distance_to_integer_shift(centres: Tensor | np.ndarray) -> np.ndarray:
    """Euclidean distance of each centre from the nearest integer shift (a kernel position): (H, 2) -> (H,)."""
    c = np.asarray(torch.as_tensor(centres, dtype=torch.float64).cpu(), dtype=float).reshape(-1, 2)
    return np.linalg.norm(c - np.round(c), axis=-1)


def probs_from_geometry(
    centres: Tensor | np.ndarray | Sequence[Any], sigma_inv: Tensor | np.ndarray | Sequence[Any], grid: tuple[int, int]
) -> Tensor:
    """Attention probabilities (H, N, N) of Gaussian heads given only their centres and ``Sigma^-1`` (a head
    history), computed by the model's own generalized encoding and attention layer (``Sigma^-1 = S S^T``)."""
    c = torch.as_tensor(np.asarray(centres, dtype=float), dtype=torch.float32).reshape(-1, 2)  # (H, 2)
    p = torch.as_tensor(np.asarray(sigma_inv, dtype=float), dtype=torch.float64).reshape(-1, 2, 2)  # (H, 2, 2)
    eigvals, eigvecs = torch.linalg.eigh(0.5 * (p + p.transpose(-1, -2)))
    sqrt = eigvecs * eigvals.clamp(min=0).sqrt()[:, None, :]  # S = V diag(sqrt lam): S S^T = Sigma^-1
    encoding = GeneralizedQuadraticEncoding(len(c))
    with torch.no_grad():
        encoding.centres.copy_(c)
        encoding.sqrt_sigma_inv.copy_(sqrt.float())
        return MultiHeadSelfAttention(encoding, in_dim=1).attention_probs(grid)


HEADS_COLUMNS = [
    "layer", "head", "encoding", "centre_row", "centre_col", "sigma_inv_rr", "sigma_inv_rc", "sigma_inv_cc",
    "eig_min", "eig_max", "mean_attention_distance", "mean_attention_distance_px", "peak_probability",
    "distance_to_integer_shift",
]  # fmt: skip


@torch.no_grad()
def heads_frame(model: SelfAttentionNet, margin: int = 2) -> pd.DataFrame:
    """One row per (layer, head) of ``model``: geometry, attention distance and convolution-likeness.

    Columns: layer, head (0-based), encoding, centre_row, centre_col, sigma_inv_rr, sigma_inv_rc, sigma_inv_cc,
    eig_min, eig_max (NaN for the learned encoding), mean_attention_distance (tokens),
    mean_attention_distance_px (pixels), peak_probability (interior queries, see ``peak_probability``),
    distance_to_integer_shift (NaN for the learned encoding).
    """
    rows: list[dict[str, Any]] = []
    for layer_idx, layer in enumerate(model.layers):
        attention: MultiHeadSelfAttention = layer.attention
        probs = attention.attention_probs(model.grid).cpu()  # (H, N, N)
        distance = mean_attention_distance(probs, model.grid)
        peak = peak_probability(probs, model.grid, margin)
        geometry = attention.head_geometry()
        num_heads = attention.num_heads
        if geometry is not None:
            centres = geometry["centres"].double().cpu().numpy()  # (H, 2)
            precision = geometry["sigma_inv"].double().cpu().numpy()  # (H, 2, 2)
            eigvals = np.linalg.eigvalsh(0.5 * (precision + precision.transpose(0, 2, 1)))  # (H, 2), ascending
            to_integer = distance_to_integer_shift(centres)
        else:
            centres = np.full((num_heads, 2), np.nan)
            precision = np.full((num_heads, 2, 2), np.nan)
            eigvals = np.full((num_heads, 2), np.nan)
            to_integer = np.full(num_heads, np.nan)
        for head in range(num_heads):
            rows.append(
                {
                    "layer": layer_idx,
                    "head": head,
                    "encoding": type(attention.encoding).__name__,
                    "centre_row": centres[head, 0],
                    "centre_col": centres[head, 1],
                    "sigma_inv_rr": precision[head, 0, 0],
                    "sigma_inv_rc": precision[head, 0, 1],
                    "sigma_inv_cc": precision[head, 1, 1],
                    "eig_min": eigvals[head, 0],
                    "eig_max": eigvals[head, 1],
                    "mean_attention_distance": float(distance[head]),
                    "mean_attention_distance_px": float(distance[head]) * model.downsample,
                    "peak_probability": float(peak[head]),
                    "distance_to_integer_shift": float(to_integer[head]),
                }
            )
    return pd.DataFrame(rows, columns=HEADS_COLUMNS)


def history_frame(head_history: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """A training run's head history (``head_snapshot`` per epoch, epoch 0 = init) as one row per
    (epoch, layer, head): epoch, layer, head, centre_row, centre_col. Empty (same columns) for no history."""
    rows = [
        {"epoch": int(snap["epoch"]), "layer": layer_idx, "head": head, "centre_row": c[0], "centre_col": c[1]}
        for snap in head_history or []
        for layer_idx, layer in enumerate(snap.get("layers", []))
        for head, c in enumerate(layer.get("centres", []))
    ]
    return pd.DataFrame(rows, columns=["epoch", "layer", "head", "centre_row", "centre_col"])


def distance_by_epoch(
    head_history: Sequence[dict[str, Any]], grid: tuple[int, int], token_size: float = 1.0
) -> pd.DataFrame:
    """Mean attention distance per layer (averaged over its heads) at every epoch of a head history:
    columns epoch, layer, mean_attention_distance (tokens x ``token_size``). Gaussian encodings only: the
    learned encoding keeps no history."""
    rows = []
    for snap in head_history or []:
        for layer_idx, layer in enumerate(snap.get("layers", [])):
            if len(layer.get("centres", [])) == 0:
                continue
            probs = probs_from_geometry(layer["centres"], layer["sigma_inv"], grid)
            distance = mean_attention_distance(probs, grid, token_size)
            rows.append({"epoch": int(snap["epoch"]), "layer": layer_idx, "mean_attention_distance": distance.mean()})
    return pd.DataFrame(rows, columns=["epoch", "layer", "mean_attention_distance"])
