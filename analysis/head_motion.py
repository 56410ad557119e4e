"""The paper's finding as numbers: how far Gaussian heads travel, how sharp they get, and whether they form a kernel.

Section 4 of the paper: trained from a random init, the quadratic heads of the first layers move to distinct shifts
around the query and concentrate there, like the taps of a convolution kernel (Lemma 1: a head attending with
probability 1 to one shift). These functions turn a head history (``head_snapshot`` per epoch, epoch 0 = init, as
``run_trial`` records it) into that claim's numbers, so a benchmark, a test and the report measure the same thing:

- **displacement**: distance in tokens between a head's centre at init and at an epoch;
- **kernel head**: a head whose centre lies within ``tolerance`` (0.5) tokens of an integer shift ``s`` with
  ``max(|s_row|, |s_col|) <= radius`` (2: a 5x5 neighbourhood of the query) *and* whose attention is sharp: at least
  ``min_peak`` (0.5) of it, averaged over queries ``radius`` tokens from every border, on a single key. Both parts
  matter: a random init already puts many centres near some integer shift, but its heads are broad (peak ~0.2);
- **distinct shifts**: how many different ``s`` the kernel heads of a layer occupy (two heads on one shift are one
  tap of the kernel, not two);
- **heads at distinct shifts** (the report's count of "heads within one token of a distinct grid position"): the
  largest number of a layer's sharp heads (peak >= ``min_peak``) that can each be given an integer shift ``s`` of
  their own (``max(|s_row|, |s_col|) <= radius``) lying within ``MATCH_TOLERANCE`` (1) token of the head's centre:
  a maximum one-to-one matching of heads to shifts. Looser on position than a kernel tap (1 token, not 0.5, and a
  head whose nearest shift is taken may use its second-nearest), as strict on sharpness, and never counts two heads
  on one shift;
- **accuracy gap**: the baseline's (ResNet18's) final test accuracy minus a variant's, in points.

Probabilities come from the model's own attention code (``analysis.geometry.probs_from_geometry``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.geometry import mean_attention_distance, peak_probability, probs_from_geometry

RADIUS = 2  # shifts up to 2 tokens from the query in each direction: a 5x5 kernel
TOLERANCE = 0.5  # tokens between a centre and its shift
MIN_PEAK = 0.5  # more than half of the head's attention on one key
MATCH_TOLERANCE = 1.0  # tokens between a centre and the shift it is matched to ("within one token")

LAYER_COLUMNS = [
    "epoch", "layer", "heads", "displacement", "centre_norm", "mean_attention_distance", "peak_probability",
    "kernel_heads", "distinct_shifts", "heads_at_distinct_shifts",
]  # fmt: skip
# What ``finding_summary`` gives at init (``<name>_init``) and at the end (``<name>``); displacement is 0 at init.
SUMMARY_MEASURES = [
    "centre_norm", "mean_attention_distance", "peak_probability", "kernel_heads", "distinct_shifts",
    "heads_at_distinct_shifts",
]  # fmt: skip


def kernel_shifts(
    centres: np.ndarray | Sequence[Sequence[float]],
    peaks: np.ndarray | Sequence[float],
    *,
    radius: int = RADIUS,
    tolerance: float = TOLERANCE,
    min_peak: float = MIN_PEAK,
) -> list[tuple[int, int] | None]:
    """Per head, the integer shift ``(row, col)`` it sits on as a kernel tap, or None (see the module docstring)."""
    c = np.asarray(centres, dtype=float).reshape(-1, 2)
    p = np.asarray(peaks, dtype=float).reshape(-1)
    if len(c) != len(p):
        raise ValueError(f"{len(c)} centres but {len(p)} peak probabilities")
    nearest = np.round(c)
    on_shift = (np.linalg.norm(c - nearest, axis=1) <= tolerance) & (np.abs(nearest).max(axis=1) <= radius)
    return [(int(s[0]), int(s[1])) if ok else None for s, ok in zip(nearest, on_shift & (p >= min_peak), strict=True)]


def heads_at_distinct_shifts(
    centres: np.ndarray | Sequence[Sequence[float]],
    peaks: np.ndarray | Sequence[float],
    *,
    radius: int = RADIUS,
    tolerance: float = MATCH_TOLERANCE,
    min_peak: float = MIN_PEAK,
) -> int:
    """How many heads sit within ``tolerance`` tokens of an integer shift of their own (see the module docstring):
    the size of a maximum matching between the sharp heads (peak >= ``min_peak``) and the shifts ``s`` with
    ``max(|s_row|, |s_col|) <= radius``, a head and a shift joined when ``||centre - s|| <= tolerance``. Found by
    augmenting paths (Kuhn's algorithm; at most 16 heads and 25 shifts here)."""
    c = np.asarray(centres, dtype=float).reshape(-1, 2)
    p = np.asarray(peaks, dtype=float).reshape(-1)
    if len(c) != len(p):
        raise ValueError(f"{len(c)} centres but {len(p)} peak probabilities")
    span = np.arange(-radius, radius + 1)
    shifts = np.stack(np.meshgrid(span, span, indexing="ij"), axis=-1).reshape(-1, 2)  # (S, 2)
    near = np.linalg.norm(c[:, None, :] - shifts[None, :, :], axis=-1) <= tolerance  # (H, S)
    options = [np.flatnonzero(row).tolist() if peak >= min_peak else [] for row, peak in zip(near, p, strict=True)]
    holder: dict[int, int] = {}  # shift index -> head matched to it

    def place(head: int, tried: set[int]) -> bool:
        """Give ``head`` a shift, moving heads already placed to another of theirs where needed."""
        for shift in options[head]:
            if shift in tried:
                continue
            tried.add(shift)
            if shift not in holder or place(holder[shift], tried):
                holder[shift] = head
                return True
        return False

    return sum(place(head, set()) for head in range(len(c)))


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
    grid: tuple[int, int],
    *,
    radius: int = RADIUS,
    tolerance: float = TOLERANCE,
    min_peak: float = MIN_PEAK,
) -> pd.DataFrame:
    """One row per layer of ``snapshot`` (a head history entry) measured against ``initial`` (the epoch-0 entry):
    the columns of ``LAYER_COLUMNS``, means over the layer's heads except the two counts. Distances in tokens."""
    rows = []
    for layer, (now, start) in enumerate(zip(snapshot["layers"], initial["layers"], strict=True)):
        centres = np.asarray(now["centres"], dtype=float).reshape(-1, 2)
        if len(centres) != len(start["centres"]):
            raise ValueError(f"layer {layer}: {len(centres)} heads now, {len(start['centres'])} at init (pruned?)")
        if len(centres) == 0:
            continue
        probs = probs_from_geometry(centres, now["sigma_inv"], grid)  # (H, N, N)
        peaks = peak_probability(probs, grid, margin=radius)
        shifts = kernel_shifts(centres, peaks, radius=radius, tolerance=tolerance, min_peak=min_peak)
        moved = np.linalg.norm(centres - np.asarray(start["centres"], dtype=float).reshape(-1, 2), axis=1)
        rows.append(
            {
                "epoch": int(snapshot["epoch"]),
                "layer": layer,
                "heads": len(centres),
                "displacement": float(moved.mean()),
                "centre_norm": float(np.linalg.norm(centres, axis=1).mean()),
                "mean_attention_distance": float(mean_attention_distance(probs, grid).mean()),
                "peak_probability": float(peaks.mean()),
                "kernel_heads": sum(s is not None for s in shifts),
                "distinct_shifts": len({s for s in shifts if s is not None}),
                "heads_at_distinct_shifts": heads_at_distinct_shifts(centres, peaks, radius=radius, min_peak=min_peak),
            }
        )
    return pd.DataFrame(rows, columns=LAYER_COLUMNS)


def motion_frame(head_history: Sequence[Mapping[str, Any]], grid: tuple[int, int], **criteria: Any) -> pd.DataFrame:
    """``layer_measures`` for every epoch of a head history (epoch 0 = init), stacked: one row per (epoch, layer).
    Empty (same columns) for an empty history, e.g. the learned encoding's or a ResNet's."""
    if not head_history:
        return pd.DataFrame(columns=LAYER_COLUMNS)
    initial = head_history[0]
    if int(initial["epoch"]) != 0:
        raise ValueError(f"the head history starts at epoch {initial['epoch']}, not at the initialisation (epoch 0)")
    frames = [layer_measures(snap, initial, grid, **criteria) for snap in head_history]
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
    counts = ["epoch", "heads"] + [
        n for m in ("kernel_heads", "distinct_shifts", "heads_at_distinct_shifts") for n in (f"{m}_init", m)
    ]
    return summary[columns].astype({name: int for name in counts})
