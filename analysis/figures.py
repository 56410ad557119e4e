"""The paper's figures (2, 3/7/10, 4/8, 6, Theorem 1) and two beyond it, as matplotlib Figures.

Built on ``matplotlib.figure.Figure`` directly: no pyplot, no backend, no global state, safe in workers.
Shifts are drawn as on the image: column shift to the right, row shift downwards, the query pixel at the origin.
Colours are colour-blind-safe: Okabe-Ito for models and layers, Paul Tol's 9-colour "muted" for heads (9 heads
per layer in the paper; beyond 9 the colours repeat with another line style / marker).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.geometry import gaussian_contour, history_frame

OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#000000", "#F0E442"]
TOL_MUTED = ["#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99", "#999933", "#AA4499"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", "--", "-.", ":"]
DPI = 120


def _style(index: int) -> tuple[str, str]:
    """Colour and marker of the index-th model or layer."""
    return OKABE_ITO[index % len(OKABE_ITO)], MARKERS[(index // len(OKABE_ITO)) % len(MARKERS)]


def _head_style(head: int) -> tuple[str, str]:
    """Colour and line style of head ``head`` (0-based)."""
    return TOL_MUTED[head % len(TOL_MUTED)], LINESTYLES[(head // len(TOL_MUTED)) % len(LINESTYLES)]


def save(fig: Figure, path: Path | str, dpi: int = DPI) -> Path:
    """Write ``fig`` as PNG (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", bbox_inches="tight")
    return path


def _grid_of(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = max(1, min(max_cols, n))
    return math.ceil(max(n, 1) / cols), cols


def _shift_axes(ax: Axes, extent: float) -> None:
    """Square axes in token shifts, image orientation, integer grid, query pixel as a black square."""
    ax.set_xlim(-extent, extent)
    ax.set_ylim(extent, -extent)  # rows grow downwards, as in the image
    ax.set_aspect("equal")
    ticks = np.arange(-math.floor(extent), math.floor(extent) + 1)
    ax.set_xticks(ticks, minor=True)
    ax.set_yticks(ticks, minor=True)
    ax.grid(True, which="minor", color="0.88", linewidth=0.6)
    ax.grid(True, which="major", color="0.75", linewidth=0.8)
    ax.add_patch(_query_square())
    ax.set_xlabel("column shift (tokens)")
    ax.set_ylabel("row shift (tokens)")


def _query_square() -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((-0.5, -0.5), 1, 1, color="black", zorder=5, label="query pixel")


def _extent(points: np.ndarray, minimum: float = 3.5) -> float:
    finite = points[np.isfinite(points)]
    return max(minimum, float(np.abs(finite).max()) + 1.0) if finite.size else minimum


def head_trajectories(head_history: Sequence[Mapping[str, Any]], layer: int, title: str | None = None) -> Figure:
    """Fig. 2: each head's centre during training at one layer; circle = initialisation, star = last epoch."""
    frame = history_frame(head_history)
    frame = frame[frame["layer"] == layer]
    fig = Figure(figsize=(6.4, 6.0))
    ax = fig.add_subplot()
    for head, path in frame.sort_values("epoch").groupby("head"):
        colour, linestyle = _head_style(int(head))
        xy = path[["centre_col", "centre_row"]].to_numpy()
        ax.plot(xy[:, 0], xy[:, 1], color=colour, linestyle=linestyle, linewidth=1.8, label=f"head {int(head) + 1}")
        ax.plot(*xy[0], "o", color=colour, markersize=6, markerfacecolor="white", markeredgewidth=1.5)
        ax.plot(*xy[-1], "*", color=colour, markersize=13, markeredgecolor="black", markeredgewidth=0.5)
    _shift_axes(ax, _extent(frame[["centre_row", "centre_col"]].to_numpy()))
    epochs = f"epochs {frame['epoch'].min()}-{frame['epoch'].max()}" if len(frame) else "no head history"
    ax.set_title(title or f"Head centres during training, layer {layer + 1} ({epochs})")
    handles, labels = ax.get_legend_handles_labels()
    from matplotlib.lines import Line2D

    handles += [
        Line2D([], [], marker="o", color="0.3", markerfacecolor="white", linestyle="", label="start (init)"),
        Line2D([], [], marker="*", color="0.3", markersize=11, linestyle="", label="end"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return fig


def _as_numpy(value: Any) -> np.ndarray:
    return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value, dtype=float)


def head_contours(
    geometry: Sequence[Mapping[str, Any]],
    pruned: Collection[tuple[int, int]] = (),
    title: str = "Attention of each head around the query pixel",
    masses: tuple[float, float] = (0.5, 0.9),
) -> Figure:
    """Figs. 3/7/10: per layer, each head's Gaussian as contours holding 50% (solid) and 90% (dotted) of its
    attention, centre dotted; ``pruned`` (layer, head) pairs (0-based) drawn grey dashed with an x.

    ``geometry`` is ``model.head_geometry()`` or a head-history snapshot's ``layers``: per layer
    ``{"centres": (H, 2), "sigma_inv": (H, 2, 2)}``. The view is clipped at +-10.5 tokens so that one far head
    does not shrink every other one to a dot.
    """
    pruned = set(pruned)
    rows, cols = _grid_of(len(geometry))
    fig = Figure(figsize=(4.2 * cols + 1.6, 4.0 * rows))
    contours = []
    for layer in geometry:
        centres = _as_numpy(layer["centres"]).reshape(-1, 2)  # (H, 2)
        precision = _as_numpy(layer["sigma_inv"]).reshape(-1, 2, 2)  # (H, 2, 2)
        rings = [(c, [gaussian_contour(c, p, m) for m in masses]) for c, p in zip(centres, precision, strict=True)]
        contours.append(rings)
    points = [pt for layer in contours for _, rings in layer for ring in rings if ring is not None for pt in ring]
    extent = min(_extent(np.asarray(points).reshape(-1, 2) if points else np.zeros((0, 2))), 10.5)
    for layer_idx, layer in enumerate(contours):
        ax = fig.add_subplot(rows, cols, layer_idx + 1)
        for head, (centre, rings) in enumerate(layer):
            is_pruned = (layer_idx, head) in pruned
            colour = "0.55" if is_pruned else _head_style(head)[0]
            for ring, style in zip(rings, ("-", ":"), strict=True):
                if ring is not None:
                    ax.plot(ring[:, 1], ring[:, 0], color=colour, linestyle="--" if is_pruned else style, lw=1.4)
            ax.plot(centre[1], centre[0], "x" if is_pruned else ".", color=colour, markersize=7 if is_pruned else 5)
        _shift_axes(ax, extent)
        ax.set_title(f"layer {layer_idx + 1}")
        if layer_idx % cols:
            ax.set_ylabel("")
        if layer_idx < len(contours) - cols:
            ax.set_xlabel("")
    from matplotlib.lines import Line2D

    legend = [Line2D([], [], color="0.2", lw=1.4, label=f"{int(100 * masses[0])}% mass")]
    legend.append(Line2D([], [], color="0.2", lw=1.4, linestyle=":", label=f"{int(100 * masses[1])}% mass"))
    legend.append(Line2D([], [], marker="s", color="black", linestyle="", label="query pixel"))
    if pruned:
        legend.append(Line2D([], [], color="0.55", lw=1.4, linestyle="--", marker="x", label="pruned head"))
    fig.legend(handles=legend, loc="center right", frameon=False)
    fig.suptitle(title)
    fig.subplots_adjust(right=1 - 1.5 / fig.get_figwidth(), top=1 - 0.7 / fig.get_figheight(), hspace=0.3, wspace=0.25)
    return fig


def attention_maps(
    maps: Sequence[Any], query: tuple[int, int], title: str | None = None, max_heads: int | None = None
) -> Figure:
    """Fig. 6: attention probabilities of every head (columns) of every layer (rows) for one query pixel (red
    square), from ``model.attention_maps(query)``: per layer an (H, rows, cols) array. One colour scale per
    panel (heads differ by orders of magnitude)."""
    arrays = [_as_numpy(m) for m in maps]
    heads = max((a.shape[0] for a in arrays), default=1)
    heads = min(heads, max_heads) if max_heads else heads
    fig = Figure(figsize=(1.4 * heads + 0.6, 1.5 * max(len(arrays), 1) + 0.8))
    axes = fig.subplots(max(len(arrays), 1), heads, squeeze=False)
    from matplotlib.patches import Rectangle

    for layer_idx, row in enumerate(axes):
        for head, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            if layer_idx >= len(arrays) or head >= arrays[layer_idx].shape[0]:
                ax.axis("off")  # a pruned layer has fewer heads
                continue
            ax.imshow(arrays[layer_idx][head], cmap="viridis", interpolation="nearest")
            ax.add_patch(Rectangle((query[1] - 0.5, query[0] - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.2))
            if layer_idx == 0:
                ax.set_title(f"head {head + 1}", fontsize=9)
            if head == 0:
                ax.set_ylabel(f"layer {layer_idx + 1}", fontsize=9)
    fig.suptitle(title or f"Attention probabilities for query pixel {tuple(query)} (red square)")
    return fig


def accuracy_curves(
    frame: pd.DataFrame,
    labels: Mapping[str, str] | None = None,
    offsets: Mapping[str, float] | None = None,
    title: str = "Test accuracy during training",
) -> Figure:
    """Figs. 4/8: test accuracy vs epoch per model, mean over seeds with a min-max band when several.

    ``frame`` columns: variant, seed, epoch, test_acc. ``offsets[variant]`` shifts a variant's epochs, so the
    pruned model (its epoch 0 is right after pruning) continues its source run: pass the source's last epoch.
    """
    labels = labels or {}
    offsets = offsets or {}
    fig = Figure(figsize=(9.5, 4.8), layout="constrained")  # the legend sits outside: curves are never hidden
    ax = fig.add_subplot()
    for index, (variant, runs) in enumerate(frame.groupby("variant", sort=False)):
        colour, _ = _style(index)
        by_epoch = runs.assign(epoch=runs["epoch"] + offsets.get(str(variant), 0)).groupby("epoch")["test_acc"]
        mean = by_epoch.mean()
        n_seeds = runs["seed"].nunique() if "seed" in runs else 1
        label = f"{labels.get(str(variant), variant)} (n={n_seeds})"
        ax.plot(mean.index, 100 * mean.to_numpy(), color=colour, linewidth=1.8, label=label)
        if n_seeds > 1:
            ax.fill_between(mean.index, 100 * by_epoch.min(), 100 * by_epoch.max(), color=colour, alpha=0.2, lw=0)
    for offset in offsets.values():
        if offset:
            ax.axvline(offset, color="0.5", linestyle=":", linewidth=1)
            ax.annotate(" pruning", (offset, 0.98), xycoords=("data", "axes fraction"), fontsize=8, color="0.4",
                        ha="left", va="top")  # fmt: skip
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, color="0.9")
    several_seeds = "seed" in frame and bool(len(frame)) and frame.groupby("variant")["seed"].nunique().gt(1).any()
    ax.set_title(title + (" (band: min-max over seeds)" if several_seeds else ""))
    if len(frame):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    ax.xaxis.get_major_locator().set_params(integer=True)  # epochs are whole numbers
    return fig


def theorem_error(points: pd.DataFrame | Sequence[tuple[float, float]], title: str | None = None) -> Figure:
    """Theorem 1: max |MHSA(X) - Conv(X)| against alpha, log-log; input is ``theorem_error_vs_alpha``'s list of
    (alpha, error) pairs or a frame with columns alpha, error. Exact zeros cannot be drawn on a log axis and
    are listed in the title."""
    frame = points if isinstance(points, pd.DataFrame) else pd.DataFrame(list(points), columns=["alpha", "error"])
    frame = frame.sort_values("alpha")
    positive = frame[(frame["error"] > 0) & (frame["alpha"] > 0)]
    fig = Figure(figsize=(6.0, 4.5))
    ax = fig.add_subplot()
    ax.loglog(positive["alpha"], positive["error"], "o-", color=OKABE_ITO[3], label="max |MHSA - conv|")
    ax.set_xlabel("alpha (attention sharpness)")
    ax.set_ylabel("max |MHSA(X) - Conv(X)|")
    ax.grid(True, which="both", color="0.9")
    zeros = len(frame) - len(positive)
    heading = title or "Theorem 1: attention converges to convolution"
    ax.set_title(heading + (f"\n({zeros} exact zeros not drawn)" if zeros else ""))
    ax.legend()
    return fig


def attention_distance_curves(frame: pd.DataFrame, labels: Mapping[str, str] | None = None) -> Figure:
    """Beyond the paper: each layer's mean attention distance (tokens) vs epoch, one panel per variant.

    ``frame`` columns: variant, epoch, layer (0-based), mean_attention_distance (``geometry.distance_by_epoch``
    per run, with a variant column; several seeds are averaged).
    """
    labels = labels or {}
    variants = list(dict.fromkeys(frame["variant"])) if len(frame) else []
    rows, cols = _grid_of(len(variants))
    fig = Figure(figsize=(4.6 * cols + 1.4, 3.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    for ax, variant in zip(axes, variants, strict=False):
        runs = frame[frame["variant"] == variant]
        for layer, curve in runs.groupby("layer"):
            mean = curve.groupby("epoch")["mean_attention_distance"].mean()
            colour, marker = _style(int(layer))
            ax.plot(mean.index, mean.to_numpy(), color=colour, marker=marker, markersize=3, label=f"layer {layer + 1}")
        ax.set_title(labels.get(variant, variant))
        ax.set_xlabel("epoch")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, color="0.9")
    for ax in axes[len(variants) :]:
        ax.axis("off")
    axes[0].set_ylabel("mean attention distance (tokens)")
    if variants:
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="center right", frameon=False)
    fig.suptitle("How far each layer looks during training")
    fig.subplots_adjust(right=1 - 1.2 / fig.get_figwidth(), top=1 - 0.75 / fig.get_figheight(), hspace=0.45)
    return fig


def convolution_likeness(heads: pd.DataFrame, title: str | None = None) -> Figure:
    """Beyond the paper: peak attention probability per (layer, head), annotated; 1 = one fixed shift, i.e. a
    convolution kernel position (Lemma 1). ``heads`` is ``geometry.heads_frame``: columns layer, head,
    peak_probability. Pruned-away heads are blank."""
    grid = heads.pivot_table(index="layer", columns="head", values="peak_probability", aggfunc="mean")
    values = grid.to_numpy(dtype=float) if grid.size else np.full((1, 1), np.nan)
    fig = Figure(figsize=(0.75 * values.shape[1] + 2.4, 0.6 * values.shape[0] + 1.6))
    ax = fig.add_subplot()
    image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for (r, c), value in np.ndenumerate(values):
        if np.isfinite(value):
            ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if value > 0.6 else "white")  # fmt: skip
    ax.set_xticks(range(values.shape[1]), [str(int(h) + 1) for h in grid.columns] if grid.size else [""])
    ax.set_yticks(range(values.shape[0]), [str(int(l) + 1) for l in grid.index] if grid.size else [""])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(image, ax=ax, label="peak attention probability")
    ax.set_title(title or "How convolution-like each head is (1 = attends to one shift)")
    return fig
