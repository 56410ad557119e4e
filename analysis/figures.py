"""The paper's figures (2, 3/7/10, 4/8, 6, Theorem 1) and those beyond it (locality during training,
convolution-likeness, ConViT's gates, accuracy and locality against the data size), as matplotlib Figures for any
variant of a study.

Built on ``matplotlib.figure.Figure`` directly (never pyplot's global figures); seaborn draws onto its axes (lines
with a min-max band over seeds, annotated heat maps). Shifts are drawn as on the image: column shift to the right,
row shift downwards, the query pixel at the origin. Variants have their fixed colours (``analysis.palette``), layers
and heads are numbered from 1 as in every CSV, and every epoch axis is the study's (``analysis.study``: a pruned
model's fine-tuning follows its source's last epoch).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from analysis.gaussian_locality import is_degenerate
from analysis.geometry import gaussian_contour, history_frame
from analysis.palette import OKABE_ITO, head_marker, head_style, layer_colours
from analysis.variants import Variant

DPI = 120
# matplotlib line styles as seaborn's dash specs (seaborn's ``dashes`` takes "" for solid or on/off lengths).
SEABORN_DASHES = {"-": "", "--": (4, 2), "-.": (4, 1.5, 1, 1.5), ":": (1, 1.5)}


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
    """Square axes in token shifts, image orientation, integer grid, query pixel as a grey square under the heads."""
    ax.set_xlim(-extent, extent)
    ax.set_ylim(extent, -extent)  # rows grow downwards, as in the image
    ax.set_aspect("equal")
    ticks = np.arange(-math.floor(extent), math.floor(extent) + 1)
    ax.set_xticks(ticks, minor=True)
    ax.set_yticks(ticks, minor=True)
    ax.grid(True, which="minor", color="0.88", linewidth=0.6)
    ax.grid(True, which="major", color="0.75", linewidth=0.8)
    # Outlined, under the heads: a head sitting on the query (shift 0) stays visible.
    ax.add_patch(
        Rectangle((-0.5, -0.5), 1, 1, facecolor="0.85", edgecolor="black", lw=1.6, zorder=1.5, label="query pixel")
    )
    ax.set_xlabel("column shift (tokens)")
    ax.set_ylabel("row shift (tokens)")


def _extent(points: np.ndarray, minimum: float = 3.5, grid: tuple[int, int] | None = None) -> float:
    """Half-width of the view: every point with a token to spare, at least ``minimum``, and never beyond the shifts
    the image has (``grid``: rows, cols of the token grid; an 8x8 grid has shifts up to +-7, so +-7.5)."""
    finite = points[np.isfinite(points)]
    extent = max(minimum, float(np.abs(finite).max()) + 1.0) if finite.size else minimum
    return min(extent, image_extent(grid)) if grid is not None else extent


def image_extent(grid: tuple[int, int]) -> float:
    """The largest shift a ``grid`` of tokens has (a corner query to the opposite corner's key), plus half a token."""
    return max(grid) - 1 + 0.5


def head_trajectories(
    head_history: Sequence[Mapping[str, Any]],
    layers: int | Sequence[int],
    title: str | None = None,
    grid: tuple[int, int] | None = None,
    panel_notes: Mapping[int, str] | None = None,
) -> Figure:
    """Fig. 2: each head's centre during training, one panel per layer of ``layers`` (from 1); circle =
    initialisation, star = last epoch; a head uniform at the last epoch (``gaussian_locality.is_degenerate``: its
    centre means nothing) is drawn thin, grey and dotted, ending in a grey cross. ``grid`` (the token grid) bounds
    the view to the image's shifts; a head beyond it is counted in its panel's title. ``panel_notes``: per layer,
    text added to its panel's title (the layer's measured numbers)."""
    layers = [layers] if isinstance(layers, int) else list(layers)
    uniform = {
        (layer, head + 1)
        for layer, entry in enumerate(head_history[-1]["layers"] if head_history else [], start=1)
        for head in np.flatnonzero(is_degenerate(entry["sigma_inv"]) if len(entry["centres"]) else [])
    }
    frame = history_frame(head_history)
    frame = frame[frame["layer"].isin(layers)]
    extent = _extent(frame[["centre_row", "centre_col"]].to_numpy(), grid=grid)
    rows, cols = _grid_of(len(layers))
    fig = Figure(figsize=(4.6 * cols + 1.8, 4.4 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, layer in zip(axes, layers, strict=False):
        shown = frame[frame["layer"] == layer]
        for head, path in shown.sort_values("epoch").groupby("head"):
            colour, linestyle = head_style(int(head))
            xy = path[["centre_col", "centre_row"]].to_numpy()
            if (layer, int(head)) in uniform:
                ax.plot(xy[:, 0], xy[:, 1], color="0.6", linestyle=":", linewidth=1.0)
                ax.plot(*xy[-1], "x", color="0.4", markersize=8, markeredgewidth=1.5)
                continue
            ax.plot(xy[:, 0], xy[:, 1], color=colour, linestyle=linestyle, linewidth=1.8, label=f"head {int(head)}")
            ax.plot(*xy[0], "o", color=colour, markersize=6, markerfacecolor="white", markeredgewidth=1.5)
            ax.plot(*xy[-1], "*", color=colour, markersize=13, markeredgecolor="black", markeredgewidth=0.5)
        _shift_axes(ax, extent)
        last = shown[shown["epoch"] == shown["epoch"].max()]
        outside = int((last[["centre_row", "centre_col"]].abs().max(axis=1) > extent).sum())
        heading = f"layer {layer}" + (f": {panel_notes[layer]}" if panel_notes and layer in panel_notes else "")
        ax.set_title(heading + (f"\n({outside} head{'s' * (outside != 1)} end beyond the view)" if outside else ""))
    for ax in axes[len(layers) :]:
        ax.axis("off")
    epochs = f"epochs {frame['epoch'].min()}-{frame['epoch'].max()}" if len(frame) else "no head history"
    fig.suptitle(title or f"Head centres during training ({epochs})")
    handles, labels = axes[0].get_legend_handles_labels()
    handles += [
        Line2D([], [], marker="o", color="0.3", markerfacecolor="white", linestyle="", label="start (init)"),
        Line2D([], [], marker="*", color="0.3", markersize=11, linestyle="", label="end"),
    ]
    if uniform:
        handles.append(Line2D([], [], color="0.6", linestyle=":", marker="x", label="became uniform (no position)"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    return fig


def _as_numpy(value: Any) -> np.ndarray:
    return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value, dtype=float)


def head_contours(
    geometry: Sequence[Mapping[str, Any]],
    pruned: Collection[tuple[int, int]] = (),
    title: str = "Attention of each head around the query pixel",
    masses: tuple[float, float] = (0.5, 0.9),
    grid: tuple[int, int] | None = None,
) -> Figure:
    """Figs. 3/7/10: per layer, each head's Gaussian as contours holding 50% (solid) and 90% (dotted) of its
    attention, centre dotted; ``pruned`` heads, as (layer, head) indices into ``geometry`` (from 0), drawn grey
    dashed with an x; a uniform head (``gaussian_locality.is_degenerate``) has no contour worth drawing, only a grey
    plus at its meaningless centre.

    ``geometry`` is ``model.head_geometry()`` or a head-history snapshot's ``layers``: per layer
    ``{"centres": (H, 2), "sigma_inv": (H, 2, 2)}``. The view is clipped to the shifts the image has (``grid``, the
    token grid: +-7.5 tokens for 8x8), or at +-10.5 tokens without one, so that one far head does not shrink every
    other one to a dot.
    """
    pruned = set(pruned)
    rows, cols = _grid_of(len(geometry))
    fig = Figure(figsize=(4.2 * cols + 2.6, 4.0 * rows))  # 2.6 in on the right: the legend, one line per head
    contours = []
    uniform = {
        (layer_idx, int(head))
        for layer_idx, layer in enumerate(geometry)
        for head in np.flatnonzero(is_degenerate(_as_numpy(layer["sigma_inv"])) if len(layer["centres"]) else [])
    }
    for layer in geometry:
        centres = _as_numpy(layer["centres"]).reshape(-1, 2)  # (H, 2)
        precision = _as_numpy(layer["sigma_inv"]).reshape(-1, 2, 2)  # (H, 2, 2)
        flat = is_degenerate(precision) if len(precision) else np.zeros(0, dtype=bool)
        rings = [
            (c, [None if f else gaussian_contour(c, p, m) for m in masses])
            for c, p, f in zip(centres, precision, flat, strict=True)
        ]
        contours.append(rings)
    points = [pt for layer in contours for _, rings in layer for ring in rings if ring is not None for pt in ring]
    limit = image_extent(grid) if grid is not None else 10.5
    extent = min(_extent(np.asarray(points).reshape(-1, 2) if points else np.zeros((0, 2))), limit)
    for layer_idx, layer in enumerate(contours):
        ax = fig.add_subplot(rows, cols, layer_idx + 1)
        for head, (centre, rings) in enumerate(layer):
            is_pruned = (layer_idx, head) in pruned
            if all(ring is None for ring in rings) and (layer_idx, head) in uniform:
                ax.plot(centre[1], centre[0], "+", color="0.45", markersize=9, markeredgewidth=1.5)
                continue
            colour = "0.55" if is_pruned else head_style(head + 1)[0]
            for ring, style in zip(rings, ("-", ":"), strict=True):
                if ring is not None:
                    ax.plot(ring[:, 1], ring[:, 0], color=colour, linestyle="--" if is_pruned else style, lw=1.4)
            marker = "x" if is_pruned else head_marker(head + 1)
            ax.plot(centre[1], centre[0], marker, color=colour, markersize=7 if is_pruned else 5)
        _shift_axes(ax, extent)
        ax.set_title(f"layer {layer_idx + 1}")
        if layer_idx % cols:
            ax.set_ylabel("")
        if layer_idx < len(contours) - cols:
            ax.set_xlabel("")
    legend = [Line2D([], [], color="0.2", lw=1.4, label=f"{int(100 * masses[0])}% mass")]
    legend.append(Line2D([], [], color="0.2", lw=1.4, linestyle=":", label=f"{int(100 * masses[1])}% mass"))
    legend.append(Line2D([], [], marker="s", color="black", markerfacecolor="0.85", linestyle="", label="query pixel"))
    heads = max((len(layer) for layer in contours), default=0)
    legend += [  # each head's colour and centre marker: past the palette's 9 colours the marker tells heads apart
        Line2D([], [], color=head_style(h)[0], lw=1.4, marker=head_marker(h), markersize=5, label=f"head {h}")
        for h in range(1, heads + 1)
    ]
    if pruned:
        legend.append(Line2D([], [], color="0.55", lw=1.4, linestyle="--", marker="x", label="pruned head"))
    if uniform:
        legend.append(Line2D([], [], color="0.45", marker="+", linestyle="", label="uniform head (no position)"))
    fig.legend(handles=legend, loc="center right", frameon=False)
    fig.suptitle(title)
    fig.subplots_adjust(right=1 - 2.5 / fig.get_figwidth(), top=1 - 0.7 / fig.get_figheight(), hspace=0.3, wspace=0.25)
    return fig


def attention_maps(
    maps: Sequence[Any], query: tuple[int, int], title: str | None = None, max_heads: int | None = None
) -> Figure:
    """Fig. 6: attention probabilities of every head (columns) of every layer (rows) for one query pixel (red
    square), from ``model.attention_maps(query)``: per layer an (H, rows, cols) array.

    One colour scale for every panel, logarithmic, with one colour bar: heads are compared across panels, and a
    sharp head (a probability near 1 on one pixel) and a broad one (1/N everywhere) differ by orders of magnitude.
    Probabilities below 1e-3 share the darkest colour.
    """
    arrays = [_as_numpy(m) for m in maps]
    heads = max((a.shape[0] for a in arrays), default=1)
    heads = max(1, min(heads, max_heads) if max_heads else heads)
    fig = Figure(figsize=(1.4 * heads + 1.4, 1.45 * max(len(arrays), 1) + 1.0), layout="constrained")
    axes = fig.subplots(max(len(arrays), 1), heads, squeeze=False)
    norm = LogNorm(vmin=1e-3, vmax=1.0, clip=True)
    image = None
    for layer_idx, row in enumerate(axes):
        for head, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            if layer_idx >= len(arrays) or head >= arrays[layer_idx].shape[0]:
                ax.axis("off")  # a pruned layer has fewer heads
                continue
            image = ax.imshow(arrays[layer_idx][head], cmap="viridis", norm=norm, interpolation="nearest")
            ax.add_patch(Rectangle((query[1] - 0.5, query[0] - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.2))
            if layer_idx == 0:
                ax.set_title(f"head {head + 1}", fontsize=9)
            if head == 0:
                ax.set_ylabel(f"layer {layer_idx + 1}", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="attention probability (log scale, shared)")
    fig.suptitle(title or f"Attention probabilities for query pixel {tuple(query)} (red square)")
    return fig


def _variant_lines(
    ax: Axes, frame: pd.DataFrame, y: str, variants: Sequence[Variant], labels: Mapping[str, str]
) -> None:
    """One line per variant (mean over seeds, min-max band when several) in the variant's colour and dash."""
    shown = [v for v in variants if v.name in set(frame["variant"])]
    data = frame.assign(label=frame["variant"].map(labels))
    sns.lineplot(
        data=data,
        x="epoch",
        y=y,
        hue="label",
        hue_order=[labels[v.name] for v in shown],
        palette={labels[v.name]: v.style.colour for v in shown},
        style="label",
        style_order=[labels[v.name] for v in shown],
        dashes={labels[v.name]: SEABORN_DASHES[v.style.dash] for v in shown},
        estimator="mean",
        errorbar=("pi", 100),  # the band spans every seed: min to max
        linewidth=1.8,
        ax=ax,
    )


def _mark_epochs(ax: Axes, markers: Mapping[str, float]) -> None:
    """A dotted vertical line with a label at each named epoch (e.g. where a model was pruned)."""
    for text, epoch in markers.items():
        ax.axvline(epoch, color="0.5", linestyle=":", linewidth=1)
        ax.annotate(f" {text}", (epoch, 0.98), xycoords=("data", "axes fraction"), fontsize=8, color="0.4", va="top")


def accuracy_curves(
    frame: pd.DataFrame,
    variants: Sequence[Variant],
    markers: Mapping[str, float] | None = None,
    title: str = "Test accuracy during training",
) -> Figure:
    """Figs. 4/8: test accuracy vs epoch per variant, mean over seeds with a min-max band when several.

    ``frame`` columns: variant, seed, epoch (the study's axis: a pruned model's epochs already follow its source's),
    test_acc. ``markers``: label -> epoch drawn as a dotted line (where a model was pruned).
    """
    n_seeds = frame.groupby("variant")["seed"].nunique() if len(frame) else pd.Series(dtype=int)
    labels = {v.name: f"{v.label} (n={int(n_seeds.get(v.name, 0))})" for v in variants}
    fig = Figure(figsize=(10.0, 4.8), layout="constrained")  # the legend sits outside: curves are never hidden
    ax = fig.add_subplot()
    if len(frame):
        _variant_lines(ax, frame.assign(test_acc=100 * frame["test_acc"]), "test_acc", variants, labels)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    _mark_epochs(ax, markers or {})
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, color="0.9")
    ax.set_title(title + (" (band: min-max over seeds)" if (n_seeds > 1).any() else ""))
    ax.xaxis.get_major_locator().set_params(integer=True)  # epochs are whole numbers
    return fig


def locality_curves(
    frame: pd.DataFrame,
    variants: Sequence[Variant],
    metric: str = "mean_distance",
    label: str = "mean attention distance (tokens)",
    threshold: tuple[float, str] | None = None,
    markers: Mapping[str, Mapping[str, float]] | None = None,
) -> Figure:
    """Beyond the paper: one panel per variant, each layer's ``metric`` (the mean over its heads) vs epoch, mean over
    seeds with a min-max band. ``frame``: variant, seed, epoch (the study's axis), layer (from 1), ``metric``.
    ``threshold``: (value, text) drawn as a dotted horizontal line in every panel; ``markers``: per variant, label
    -> epoch (where it was pruned)."""
    shown = [v for v in variants if v.name in set(frame["variant"])]
    cols = max(1, min(3, len(shown)))
    rows = max(1, math.ceil(len(shown) / cols))
    fig = Figure(figsize=(4.6 * cols + 1.6, 3.4 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()  # one epoch axis for all
    layers = sorted(frame["layer"].unique()) if len(frame) else []
    palette = dict(zip(layers, layer_colours(len(layers)), strict=True))
    for ax, variant in zip(axes, shown, strict=False):
        data = frame[frame["variant"] == variant.name]
        sns.lineplot(
            data=data,
            x="epoch",
            y=metric,
            hue="layer",
            palette=palette,
            estimator="mean",
            errorbar=("pi", 100),
            marker="o",
            markersize=4,
            linewidth=1.6,
            legend=False,
            ax=ax,
        )
        if threshold is not None:
            ax.axhline(threshold[0], color="0.35", linestyle=":", linewidth=1.2)
        _mark_epochs(ax, (markers or {}).get(variant.name, {}))
        ax.set_title(variant.label, fontsize=10, color=variant.style.colour)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.tick_params(labelbottom=True)
        ax.grid(True, color="0.9")
    for ax in axes[len(shown) :]:
        ax.axis("off")
    handles = [
        Line2D([], [], color=palette[layer], marker="o", markersize=4, label=f"layer {layer}") for layer in layers
    ]
    if threshold is not None:
        handles.append(Line2D([], [], color="0.35", linestyle=":", label=threshold[1]))
    fig.legend(handles=handles, loc="outside right upper", frameon=False, fontsize=9)
    fig.suptitle(f"Locality during training: {label}, each layer's mean over its heads")
    return fig


def data_size_curves(frame: pd.DataFrame) -> Figure:
    """Beyond the paper: final test accuracy and layer 1's mean attention distance against the training data fraction,
    one line per encoding (mean over seeds, a min-max band when several; dots: each run). ``frame``: encoding,
    data_fraction, seed, test_acc, layer1_distance (NaN for a model without attention)."""
    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    acc_ax, dist_ax = fig.subplots(1, 2)
    encodings = list(dict.fromkeys(frame["encoding"]))
    palette = dict(zip(encodings, [OKABE_ITO[i % len(OKABE_ITO)] for i in range(len(encodings))], strict=True))
    data = frame.assign(test_acc=100 * frame["test_acc"])
    for ax, column, label in (
        (acc_ax, "test_acc", "final test accuracy (%)"),
        (dist_ax, "layer1_distance", "layer 1: mean attention distance (tokens)"),
    ):
        shown = data.dropna(subset=[column])
        if len(shown):
            sns.lineplot(
                data=shown,
                x="data_fraction",
                y=column,
                hue="encoding",
                hue_order=[e for e in encodings if e in set(shown["encoding"])],
                palette=palette,
                estimator="mean",
                errorbar=("pi", 100),
                marker="o",
                linewidth=1.8,
                ax=ax,
            )
            sns.scatterplot(data=shown, x="data_fraction", y=column, hue="encoding", palette=palette, s=14,
                            alpha=0.5, legend=False, ax=ax)  # fmt: skip
            ax.legend(fontsize=9, frameon=False)
        ax.set_xscale("log", base=2)  # data sizes halve and double
        ax.set_xticks(
            sorted(frame["data_fraction"].unique()), [f"{f:g}" for f in sorted(frame["data_fraction"].unique())]
        )
        ax.set_xlabel("train.data_fraction (of every class)")
        ax.set_ylabel(label)
        ax.grid(True, color="0.9")
    fig.suptitle("Accuracy and layer-1 locality against the training data size, per encoding")
    return fig


def gate_heatmap(gates: pd.DataFrame, title: str | None = None) -> Figure:
    """Beyond the paper: ConViT's gate ``sigma(lambda)`` per head (columns, from 1) and layer (rows, from 1), annotated,
    on a fixed 0..1 scale (1: the head attends by position only). ``gates``: layer, head, gate."""
    table = gates.pivot(index="layer", columns="head", values="gate")
    fig = Figure(figsize=(0.55 * table.shape[1] + 2.2, 0.45 * table.shape[0] + 1.4), layout="constrained")
    ax = fig.subplots()
    sns.heatmap(table, vmin=0.0, vmax=1.0, cmap="viridis", annot=True, fmt=".2f", annot_kws={"fontsize": 7}, ax=ax)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if title:
        ax.set_title(title, fontsize=10)
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
    ax.loglog(positive["alpha"], positive["error"], "o-", color=OKABE_ITO[4], label="max |MHSA - conv|")
    ax.set_xlabel("alpha (attention sharpness)")
    ax.set_ylabel("max |MHSA(X) - Conv(X)|")
    ax.grid(True, which="both", color="0.9")
    zeros = len(frame) - len(positive)
    heading = title or "Theorem 1: attention converges to convolution"
    ax.set_title(heading + (f"\n({zeros} exact zeros not drawn)" if zeros else ""))
    ax.legend()
    return fig


def convolution_likeness(heads: pd.DataFrame, title: str | None = None) -> Figure:
    """Beyond the paper: peak attention probability per (layer, head), annotated; 1 = one fixed shift, i.e. a
    convolution kernel position (Lemma 1). ``heads`` is ``geometry.heads_frame`` (layers and heads from 1): columns
    layer, head, peak_probability. Heads a pruned layer no longer has are blank."""
    grid = heads.pivot_table(index="layer", columns="head", values="peak_probability", aggfunc="mean")
    shape = grid.shape if grid.size else (1, 1)
    fig = Figure(figsize=(0.75 * shape[1] + 2.8, 0.6 * shape[0] + 1.7), layout="constrained")
    ax = fig.add_subplot()
    sns.heatmap(
        grid if grid.size else pd.DataFrame([[np.nan]]),
        vmin=0.0,
        vmax=1.0,
        cmap="viridis",
        annot=True,
        fmt=".2f",
        annot_kws={"fontsize": 8},
        cbar_kws={"label": "peak attention probability"},
        linewidths=0.5,
        linecolor="white",
        ax=ax,
    )
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(title or "How convolution-like each head is (1 = attends to one shift)")
    return fig
