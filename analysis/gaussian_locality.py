"""Where a Gaussian head looks, from its own distribution: locality numbers that do not depend on the token grid.

The trial measures locality on the grid it trains on (``pipeline.trial.locality``), where keys exist only inside
the image: a query near a border loses the keys beyond it, so a head's distance, entropy and peak there are
*truncated*, and how much depends on the grid (a uniform head reads 4.14 tokens on 8x8 and 8.33 on 16x16; a sharp
head at shift (0, 2) 1.62 and 1.81). A Gaussian head's attention is known from its centre ``Delta`` and
``Sigma^-1`` alone, so here it is measured for a query with every key around it, as on an unbounded grid:

    p(d) = exp(-1/2 (d - Delta)^T Sigma^-1 (d - Delta)) / Z   over integer shifts d = key - query

- **distance**: ``sum_d p(d) ||d||`` in tokens; **entropy**: ``-sum_d p(d) log p(d)`` in nats; **peak**:
  ``max_d p(d)`` (1 for Lemma 1's head on one shift);
- **mode**: the shift ``d`` of the peak, where the head puts most of its mass (a head's position as a kernel tap);
- **degenerate**: ``Sigma^-1``'s largest eigenvalue below the paper's uniformity bound (1e-5, App. A.1): the head
  attends uniformly; its centre means nothing and it takes no part in any mean or count of positions.

The same head gives the same numbers on any grid (tested on 8x8 and 16x16). The sum runs over the shifts within
``reach`` tokens of the centre along the head's widest axis (7 standard deviations: the mass beyond is below
1e-10), at most ``MAX_REACH`` tokens: a wider head (a stripe, a near-uniform head) reads the values of that window,
a lower bound on its distance and entropy and an upper bound on its peak; it is never convolution-like either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.models.pruning import PAPER_MIN_EIGENVALUE

SIGMAS = 7.0  # standard deviations along the widest axis the sum covers
MAX_REACH = 64  # tokens: the widest window summed over (129 x 129 shifts)
# A head is convolution-like when it looks no further than a 3x3 kernel's reach (its corner shifts are sqrt(2) ~ 1.41
# tokens from the query) *and* puts at least half its attention on one shift: distance alone admits broad heads
# centred on the query (distance 1.49 at peak 0.29), which attend to a blur, not to a kernel's tap.
CONV_LIKE_MAX_DISTANCE = 1.5
CONV_LIKE_MIN_PEAK = 0.5
CONV_LIKE_RULE = (
    f"distance <= {CONV_LIKE_MAX_DISTANCE} tokens (a 3x3 kernel's reach) and peak >= {CONV_LIKE_MIN_PEAK} (half its "
    "attention on one shift), both from the head's own Gaussian on an unbounded grid"
)
COLUMNS = ["distance", "entropy", "peak", "mode_row", "mode_col", "degenerate"]


def _arrays(centres: Any, sigma_inv: Any) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(centres, dtype=np.float64).reshape(-1, 2)  # (H, 2)
    p = np.asarray(sigma_inv, dtype=np.float64).reshape(-1, 2, 2)  # (H, 2, 2)
    if len(c) != len(p):
        raise ValueError(f"{len(c)} centres but {len(p)} Sigma^-1")
    return c, 0.5 * (p + p.transpose(0, 2, 1))


def is_degenerate(sigma_inv: Any, min_eigenvalue: float = PAPER_MIN_EIGENVALUE) -> np.ndarray:
    """(H,) bool: ``Sigma^-1``'s largest eigenvalue below ``min_eigenvalue``, the paper's bound for a uniform head."""
    p = np.asarray(sigma_inv, dtype=np.float64).reshape(-1, 2, 2)
    return np.linalg.eigvalsh(0.5 * (p + p.transpose(0, 2, 1)))[:, 1] < min_eigenvalue


def _head(centre: np.ndarray, precision: np.ndarray) -> tuple[float, float, float, tuple[int, int]]:
    """distance, entropy, peak, mode of one head over the shifts around its centre (the module docstring)."""
    smallest = max(float(np.linalg.eigvalsh(precision)[0]), 0.0)
    reach = MAX_REACH if smallest <= 0 else min(MAX_REACH, math.ceil(SIGMAS / math.sqrt(smallest)) + 1)
    base = np.round(centre).astype(int)
    span = np.arange(-reach, reach + 1)
    rows, cols = np.meshgrid(base[0] + span, base[1] + span, indexing="ij")
    shifts = np.stack([rows, cols], axis=-1).reshape(-1, 2).astype(np.float64)  # (K, 2) integer shifts d
    diff = shifts - centre
    score = -0.5 * np.einsum("ki,ij,kj->k", diff, precision, diff)
    score -= score.max()
    p = np.exp(score)
    p /= p.sum()
    top = int(np.argmax(p))
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    mode = (int(shifts[top, 0]), int(shifts[top, 1]))
    return float((p * np.linalg.norm(shifts, axis=1)).sum()), entropy, float(p[top]), mode


def gaussian_locality(
    centres: Any, sigma_inv: Any, min_eigenvalue: float = PAPER_MIN_EIGENVALUE
) -> dict[str, np.ndarray]:
    """Per head, the ``COLUMNS`` (arrays of H) of Gaussian heads given by their centres (H, 2) and ``Sigma^-1``
    (H, 2, 2), on an unbounded grid (the module docstring). A degenerate head's numbers are NaN and its mode
    (0, 0): it has no position."""
    c, p = _arrays(centres, sigma_inv)
    degenerate = is_degenerate(p, min_eigenvalue)
    out = {name: np.full(len(c), np.nan) for name in COLUMNS[:3]}
    modes = np.zeros((len(c), 2), dtype=int)
    for head in range(len(c)):
        if degenerate[head] or not (np.isfinite(c[head]).all() and np.isfinite(p[head]).all()):
            continue
        out["distance"][head], out["entropy"][head], out["peak"][head], modes[head] = _head(c[head], p[head])
    return {**out, "mode_row": modes[:, 0], "mode_col": modes[:, 1], "degenerate": degenerate}


def conv_like(distance: Sequence[float] | np.ndarray, peak: Sequence[float] | np.ndarray) -> np.ndarray:
    """(H,) bool: ``CONV_LIKE_RULE`` (NaN, a degenerate head, is never convolution-like)."""
    d, p = np.asarray(distance, dtype=float), np.asarray(peak, dtype=float)
    with np.errstate(invalid="ignore"):
        return (d <= CONV_LIKE_MAX_DISTANCE) & (p >= CONV_LIKE_MIN_PEAK)
