"""The paper's finding as numbers: how far Gaussian heads travel, how sharp they get, and whether they form a kernel.

Section 4 of the paper: trained from a random init, the quadratic heads of the first layers move to distinct shifts
around the query and concentrate there, like the taps of a convolution kernel (Lemma 1: a head attending with
probability 1 to one shift). These functions turn a head history (``head_snapshot`` per epoch, epoch 0 = init, as
``run_trial`` records it) into that claim's numbers, so a benchmark, a test and the report measure the same thing.
Every locality number is the head's own Gaussian on an unbounded grid (``analysis.gaussian_locality``), so it does
not depend on the grid the model trained on; **degenerate** heads (``Sigma^-1`` below the paper's uniformity bound:
they attend uniformly, their centre means nothing) are counted apart and left out of every mean and count below:

- **displacement**: distance in tokens between a head's centre at init and at an epoch;
- **kernel head**: a head whose centre lies within ``tolerance`` (0.5) tokens of an integer shift ``s`` with
  ``max(|s_row|, |s_col|) <= radius`` (2: a 5x5 neighbourhood of the query) *and* whose attention is sharp: at least
  ``min_peak`` (0.5) of it on a single shift. Both parts matter: a random init already puts many centres near some
  integer shift, but its heads are broad (peak ~0.2);
- **distinct shifts**: how many different ``s`` the kernel heads of a layer occupy (two heads on one shift are one
  tap of the kernel, not two);
- **heads at distinct shifts** (the report's count): how many different shifts in the 5x5 neighbourhood the layer's
  sharp heads (peak >= ``min_peak``) put most of their mass on (each head's *mode*): two heads on one shift count
  once, so it never exceeds the shifts the sharp heads occupy;
- **shifts by position**: the same count over every non-degenerate head, sharp or not: where the heads *are*, so
  beside the sharp count it shows whether training moved the heads or sharpened them (a random init already has
  several heads on distinct shifts by position, none sharp);
- **accuracy gap**: the baseline's (ResNet18's) final test accuracy minus a variant's, in points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.gaussian_locality import gaussian_locality, is_degenerate

RADIUS = 2  # shifts up to 2 tokens from the query in each direction: a 5x5 kernel
TOLERANCE = 0.5  # tokens between a centre and its shift
MIN_PEAK = 0.5  # more than half of the head's attention on one key

LAYER_COLUMNS = [
    "epoch", "layer", "heads", "degenerate", "displacement", "centre_norm", "mean_attention_distance",
    "peak_probability", "kernel_heads", "distinct_shifts", "heads_at_distinct_shifts", "shifts_by_position",
]  # fmt: skip
# What ``finding_summary`` gives at init (``<name>_init``) and at the end (``<name>``); displacement is 0 at init.
SUMMARY_MEASURES = [
    "degenerate", "centre_norm", "mean_attention_distance", "peak_probability", "kernel_heads", "distinct_shifts",
    "heads_at_distinct_shifts", "shifts_by_position",
]  # fmt: skip
COUNTS = ["degenerate", "kernel_heads", "distinct_shifts", "heads_at_distinct_shifts", "shifts_by_position"]


def kernel_shifts(
    centres: np.ndarray | Sequence[Sequence[float]],
    peaks: np.ndarray | Sequence[float],
    *,
    radius: int = RADIUS,
    tolerance: float = TOLERANCE,
    min_peak: float = MIN_PEAK,
) -> list[tuple[int, int] | None]:
    """Per head, the integer shift ``(row, col)`` it sits on as a kernel tap, or None (see the module docstring;
    a NaN peak, a degenerate head's, is never a tap)."""
    c = np.asarray(centres, dtype=float).reshape(-1, 2)
    p = np.asarray(peaks, dtype=float).reshape(-1)
    if len(c) != len(p):
        raise ValueError(f"{len(c)} centres but {len(p)} peak probabilities")
    nearest = np.round(c)
    on_shift = (np.linalg.norm(c - nearest, axis=1) <= tolerance) & (np.abs(nearest).max(axis=1) <= radius)
    return [(int(s[0]), int(s[1])) if ok else None for s, ok in zip(nearest, on_shift & (p >= min_peak), strict=True)]


def distinct_modes(
    modes: np.ndarray | Sequence[Sequence[int]], counted: np.ndarray | Sequence[bool], *, radius: int = RADIUS
) -> int:
    """How many different shifts within ``radius`` (``max(|row|, |col|)``) the ``counted`` heads' modes occupy: two
    heads on one shift count once."""
    m = np.asarray(modes, dtype=int).reshape(-1, 2)
    keep = np.asarray(counted, dtype=bool).reshape(-1) & (np.abs(m).max(axis=1) <= radius)
    return len({(int(r), int(c)) for r, c in m[keep]})


def gap_to_baseline(accuracies: Mapping[str, float], baseline: str) -> dict[str, float]:
    """Per variant other than ``baseline``: the baseline's test accuracy minus the variant's, in points (positive:
    the variant is behind). NaN where either accuracy is missing or not finite; an empty dict without the baseline."""
    if baseline not in accuracies:
        return {}
    base = float(accuracies[baseline])
    return {
        name: 100.0 * (base - float(acc)) if np.isfinite(base) and np.isfinite(float(acc)) else float("nan")
        for name, acc in accuracies.items()
        if name != baseline
    }


def layer_measures(
    snapshot: Mapping[str, Any],
    initial: Mapping[str, Any],
    *,
    radius: int = RADIUS,
    tolerance: float = TOLERANCE,
    min_peak: float = MIN_PEAK,
) -> pd.DataFrame:
    """One row per layer of ``snapshot`` (a head history entry) measured against ``initial`` (the epoch-0 entry):
    the columns of ``LAYER_COLUMNS``, means over the layer's non-degenerate heads (NaN when all are) except the
    counts. Distances in tokens, from each head's own Gaussian (no grid: ``analysis.gaussian_locality``)."""
    rows = []
    for layer, (now, start) in enumerate(zip(snapshot["layers"], initial["layers"], strict=True)):
        centres = np.asarray(now["centres"], dtype=float).reshape(-1, 2)
        if len(centres) != len(start["centres"]):
            raise ValueError(f"layer {layer}: {len(centres)} heads now, {len(start['centres'])} at init (pruned?)")
        if len(centres) == 0:
            continue
        local = gaussian_locality(centres, now["sigma_inv"])
        live = ~local["degenerate"]
        shifts = kernel_shifts(centres, local["peak"], radius=radius, tolerance=tolerance, min_peak=min_peak)
        moved = np.linalg.norm(centres - np.asarray(start["centres"], dtype=float).reshape(-1, 2), axis=1)
        modes = np.stack([local["mode_row"], local["mode_col"]], axis=1)
        with np.errstate(invalid="ignore"):
            sharp = live & (local["peak"] >= min_peak)
        rows.append(
            {
                "epoch": int(snapshot["epoch"]),
                "layer": layer,
                "heads": len(centres),
                "degenerate": int((~live).sum()),
                "displacement": _mean(moved[live]),
                "centre_norm": _mean(np.linalg.norm(centres, axis=1)[live]),
                "mean_attention_distance": _mean(local["distance"][live]),
                "peak_probability": _mean(local["peak"][live]),
                "kernel_heads": sum(s is not None for s in shifts),
                "distinct_shifts": len({s for s in shifts if s is not None}),
                "heads_at_distinct_shifts": distinct_modes(modes, sharp, radius=radius),
                "shifts_by_position": distinct_modes(modes, live, radius=radius),
            }
        )
    return pd.DataFrame(rows, columns=LAYER_COLUMNS)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else float("nan")


def uniform_heads(head_history: Sequence[Mapping[str, Any]]) -> list[list[tuple[int, int]]]:
    """Per layer (from 0), the heads (from 0) degenerate at the last epoch of ``head_history``, each with the epoch
    from which it stayed degenerate to the end: ``[(head, epoch), ...]``, by epoch. Empty for an empty history."""
    if not head_history:
        return []
    flags = [[is_degenerate(layer["sigma_inv"]) for layer in snap["layers"]] for snap in head_history]
    epochs = [int(snap["epoch"]) for snap in head_history]
    named = []
    for layer, last in enumerate(flags[-1]):
        heads = []
        for head in np.flatnonzero(last):
            since = len(flags) - 1
            while since > 0 and flags[since - 1][layer][head]:
                since -= 1
            heads.append((int(head), epochs[since]))
        named.append(sorted(heads, key=lambda pair: (pair[1], pair[0])))
    return named


def motion_frame(head_history: Sequence[Mapping[str, Any]], **criteria: Any) -> pd.DataFrame:
    """``layer_measures`` for every epoch of a head history (epoch 0 = init), stacked: one row per (epoch, layer).
    Empty (same columns) for an empty history, e.g. the learned encoding's or a ResNet's."""
    if not head_history:
        return pd.DataFrame(columns=LAYER_COLUMNS)
    initial = head_history[0]
    if int(initial["epoch"]) != 0:
        raise ValueError(f"the head history starts at epoch {initial['epoch']}, not at the initialisation (epoch 0)")
    frames = [layer_measures(snap, initial, **criteria) for snap in head_history]
    return pd.concat(frames, ignore_index=True)


def finding_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """A ``motion_frame`` reduced to the claim: one row per layer (numbered from 1, as every figure shows them) with
    the epoch measured, its head count, the displacement at that epoch, and each of ``SUMMARY_MEASURES`` at init
    (``<measure>_init``) and at the last epoch (``<measure>``). Empty (same columns) for an empty frame."""
    columns = ["layer", "epoch", "heads", "displacement"]
    columns += [name for measure in SUMMARY_MEASURES for name in (f"{measure}_init", measure)]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    init = frame[frame["epoch"] == frame["epoch"].min()].set_index("layer")
    end = frame[frame["epoch"] == frame["epoch"].max()].set_index("layer")
    summary = end[["epoch", "heads", "displacement"]].copy()
    for measure in SUMMARY_MEASURES:
        summary[f"{measure}_init"] = init[measure]
        summary[measure] = end[measure]
    summary = summary.reset_index()
    summary["layer"] = summary["layer"].astype(int) + 1
    counts = ["epoch", "heads"] + [n for m in COUNTS for n in (f"{m}_init", m)]
    return summary[columns].astype({name: int for name in counts})
