"""Where each attention head looks, as numbers: Gaussian contours, head tables, locality per epoch.

Coordinates are ``(row, col)`` shifts ``delta = key - query`` in tokens of the attention grid (one token is
``downsample`` pixels of the image wide, so pixels = tokens x downsample). Every probability comes from the
model's own ``attention_probs``, every centre / ``Sigma^-1`` from its ``head_geometry`` and every locality number
from the definitions the trial measures with (``pipeline.trial.locality``), so the analysis and the training code
share one definition of each quantity. Frames number layers and heads from 1, as every figure and CSV shows them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from analysis.gaussian_locality import conv_like, gaussian_locality
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.generalized_quadratic import GeneralizedQuadraticEncoding
from pipeline.models.positional import relative_offsets
from pipeline.models.sa_net import SelfAttentionNet
from pipeline.trial.locality import PEAK_MARGIN, head_locality
from pipeline.trial.report import LOCALITY_METRICS

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


def query_key_distance(grid: tuple[int, int]) -> Tensor:
    """Euclidean distance in tokens between query and key, (N, N), from the models' own relative offsets."""
    return relative_offsets(*grid).double().norm(dim=-1)


def mean_attention_distance(probs: Tensor | np.ndarray, grid: tuple[int, int], token_size: float = 1.0) -> np.ndarray:
    """Per head, E[||key - query||] under the head's attention, averaged over all queries: (H, N, N) -> (H,).

    The trial's ``mean_distance`` (``pipeline.trial.locality``). Units: tokens of the attention grid times
    ``token_size`` (pass the model's ``downsample`` to get image pixels).
    """
    probs = torch.as_tensor(probs, dtype=torch.float64)
    return (head_locality(probs, grid)["mean_distance"] * token_size).numpy()


def peak_probability(probs: Tensor | np.ndarray, grid: tuple[int, int], margin: int = PEAK_MARGIN) -> np.ndarray:
    """Per head, the largest attention probability of a query, averaged over interior queries: (H,) (the trial's
    ``peak_probability``: 1 for Lemma 1's convolution-like head)."""
    return head_locality(torch.as_tensor(probs, dtype=torch.float64), grid, margin)["peak_probability"].numpy()


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


def _float64(values: Tensor | Sequence[Any]) -> np.ndarray:
    """A model's float32 tensor or a snapshot's lists (float32 values written exactly) as float64: the same numbers."""
    return values.double().cpu().numpy() if isinstance(values, Tensor) else np.asarray(values, dtype=float)


HEADS_COLUMNS = [
    "layer",
    "head",
    "encoding",
    "centre_row",
    "centre_col",
    "sigma_inv_rr",
    "sigma_inv_rc",
    "sigma_inv_cc",
    "eig_min",
    "eig_max",
    "mean_distance",
    "mean_distance_px",
    "entropy",
    "peak_probability",
    "distance_to_integer_shift",
    "degenerate",
    "gaussian_distance",
    "gaussian_entropy",
    "gaussian_peak",
    "conv_like",
]


@torch.no_grad()
def heads_frame(
    model: SelfAttentionNet,
    locality: Sequence[Mapping[str, Sequence[float]]] | None = None,
    geometry: Sequence[Mapping[str, Any]] | None = None,
) -> pd.DataFrame:
    """One row per (layer, head) of ``model``, both numbered from 1: geometry and locality.

    Columns: layer, head, encoding, centre_row, centre_col, sigma_inv_rr, sigma_inv_rc, sigma_inv_cc, eig_min,
    eig_max (NaN for the learned encoding), mean_distance (tokens), mean_distance_px (pixels), entropy (nats),
    peak_probability (interior queries): these four as the trial measures them, truncated at the grid's borders, so
    they depend on the grid; distance_to_integer_shift, degenerate (uniform: the paper's bound), gaussian_distance,
    gaussian_entropy, gaussian_peak (the head's own Gaussian on an unbounded grid, ``analysis.gaussian_locality``:
    the same on any grid; NaN for a degenerate head and the learned encoding), conv_like (``CONV_LIKE_RULE`` on the
    Gaussian numbers; for the learned encoding, which has no Gaussian, and for heads that also read the content
    (GPSA, ``model.content``), whose Gaussian is only their positional part, on the truncated ones).
    ``locality``: the trial's last measurement (a locality-history snapshot's ``layers``), measured on each layer's
    real input; without it, the probabilities of position-only attention (the same numbers for this model).
    ``geometry``: the heads' centres and ``Sigma^-1`` per layer (a head history snapshot's ``layers``, exact) instead of
    ``model``'s: another run's heads, ``model`` only giving the architecture (layers, heads, encodings, token size).
    With a snapshot, pass that run's ``locality`` too (``model``'s weights are not that run's).
    """
    if geometry is not None and locality is None:
        raise ValueError("heads_frame: a snapshot's geometry needs its run's locality (the model's is another run's)")
    rows: list[dict[str, Any]] = []
    for layer_idx, layer in enumerate(model.layers):
        attention: MultiHeadSelfAttention = layer.attention
        num_heads = attention.num_heads
        if locality is not None:
            measured = {name: np.asarray(locality[layer_idx][name], dtype=float) for name in LOCALITY_METRICS}
        elif num_heads:
            values = head_locality(attention.attention_probs(model.grid).cpu(), model.grid)
            measured = {name: values[name].numpy() for name in LOCALITY_METRICS}
        heads = attention.head_geometry() if geometry is None else geometry[layer_idx] if num_heads else None
        if heads is not None:
            centres = _float64(heads["centres"]).reshape(-1, 2)  # (H, 2)
            precision = _float64(heads["sigma_inv"]).reshape(-1, 2, 2)  # (H, 2, 2)
            eigvals = np.linalg.eigvalsh(0.5 * (precision + precision.transpose(0, 2, 1)))  # (H, 2), ascending
            to_integer = distance_to_integer_shift(centres)
            local = gaussian_locality(centres, precision)
        else:
            centres = np.full((num_heads, 2), np.nan)
            precision = np.full((num_heads, 2, 2), np.nan)
            eigvals = np.full((num_heads, 2), np.nan)
            to_integer = np.full(num_heads, np.nan)
            local = {"degenerate": np.zeros(num_heads, dtype=bool)}
            local |= {name: np.full(num_heads, np.nan) for name in ("distance", "entropy", "peak")}
        if num_heads:  # a head that also reads the content is more than its Gaussian: judged as measured
            likeness = (
                conv_like(local["distance"], local["peak"])
                if heads is not None and not attention.reads_content
                else conv_like(measured["mean_distance"], measured["peak_probability"])
            )
        for head in range(num_heads):
            rows.append(
                {
                    "layer": layer_idx + 1,
                    "head": head + 1,
                    "encoding": type(attention.encoding).__name__,
                    "centre_row": centres[head, 0],
                    "centre_col": centres[head, 1],
                    "sigma_inv_rr": precision[head, 0, 0],
                    "sigma_inv_rc": precision[head, 0, 1],
                    "sigma_inv_cc": precision[head, 1, 1],
                    "eig_min": eigvals[head, 0],
                    "eig_max": eigvals[head, 1],
                    "mean_distance": float(measured["mean_distance"][head]),
                    "mean_distance_px": float(measured["mean_distance"][head]) * model.downsample,
                    "entropy": float(measured["entropy"][head]),
                    "peak_probability": float(measured["peak_probability"][head]),
                    "distance_to_integer_shift": float(to_integer[head]),
                    "degenerate": bool(local["degenerate"][head]),
                    "gaussian_distance": float(local["distance"][head]),
                    "gaussian_entropy": float(local["entropy"][head]),
                    "gaussian_peak": float(local["peak"][head]),
                    "conv_like": bool(likeness[head]),
                }
            )
    return pd.DataFrame(rows, columns=HEADS_COLUMNS)


def history_frame(head_history: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """A training run's head history (``head_snapshot`` per epoch, epoch 0 = init) as one row per
    (epoch, layer, head), layers and heads from 1: epoch, layer, head, centre_row, centre_col. Empty (same columns)
    for no history."""
    rows = [
        {"epoch": int(snap["epoch"]), "layer": layer_idx, "head": head, "centre_row": c[0], "centre_col": c[1]}
        for snap in head_history or []
        for layer_idx, layer in enumerate(snap.get("layers", []), start=1)
        for head, c in enumerate(layer.get("centres", []), start=1)
    ]
    return pd.DataFrame(rows, columns=["epoch", "layer", "head", "centre_row", "centre_col"])


LOCALITY_COLUMNS = ["epoch", "layer", "head", *LOCALITY_METRICS]


def locality_frame(locality_history: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """A run's locality history (``pipeline.trial.locality``, epoch 0 = before training) as one row per (epoch, layer,
    head), layers and heads from 1, with the trial's metrics. Empty (same columns) for no history."""
    rows = [
        {
            "epoch": int(snap["epoch"]),
            "layer": layer_idx,
            "head": head,
            **{m: values[m][head - 1] for m in LOCALITY_METRICS},
        }
        for snap in locality_history or []
        for layer_idx, values in enumerate(snap.get("layers", []), start=1)
        for head in range(1, len(values.get("mean_distance", [])) + 1)
    ]
    return pd.DataFrame(rows, columns=LOCALITY_COLUMNS).astype({"epoch": int, "layer": int, "head": int})
