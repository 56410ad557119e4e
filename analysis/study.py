"""Every output of the analysis stage from a loaded study: tables, figures, plot data, metrics and the report.

No MLflow here (``analysis.runs`` fetches the runs); this module turns ``LoadedStudy`` into files. A figure whose
model was not run (or has no usable checkpoint) is skipped with a line saying so, in the log and in the report.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from analysis import figures
from analysis.geometry import HEADS_COLUMNS, distance_by_epoch, heads_frame, history_frame
from analysis.report import FigureEntry, render_report
from analysis.runs import LoadedRun, LoadedStudy
from analysis.table import PRUNED, accuracy_table, metrics_summary, to_markdown, write_metrics, write_table
from pipeline.io import write_text_atomic
from pipeline.measure.reference import PAPER_FIGURES, PAPER_PRUNED_HEADS
from pipeline.models.conv_to_attention import theorem_error_vs_alpha
from pipeline.models.sa_net import SelfAttentionNet

log = logging.getLogger(__name__)

LABELS = {variant: ref.label for variant, ref in PAPER_FIGURES.items()}
THEOREM_ALPHAS = [0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0]


@dataclass(frozen=True)
class Layout:
    """Where the outputs go, under one root (the project root for the stage)."""

    root: Path

    @property
    def tables(self) -> Path:
        return self.root / "results/tables"

    @property
    def figures(self) -> Path:
        return self.root / "results/figures"

    @property
    def plots(self) -> Path:
        return self.root / "results/plots"

    @property
    def metrics(self) -> Path:
        return self.root / "results/analysis/metrics.json"

    @property
    def report(self) -> Path:
        return self.root / "results/report.md"


@dataclass
class Outputs:
    table: pd.DataFrame
    heads: pd.DataFrame
    summary: dict[str, Any]
    files: dict[str, list[Path]] = field(default_factory=dict)  # MLflow artifact folder -> files
    figures: list[FigureEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _fmt_pct(value: float) -> str:
    return f"{100 * value:.1f}%" if math.isfinite(value) else "–"


def setting_of(data: Mapping[str, Any], study: LoadedStudy) -> dict[str, Any]:
    """What was trained: dataset (params.yaml ``data``), image size (the checkpoints'), and from the runs' own params
    the epochs, widths and seeds."""
    params = next((r.params for r in study.runs if r.params and r.source == "tune"), {})
    shapes = [r.image_shape for r in study.runs if r.image_shape]
    side = data.get("image_size", "?")
    size = f"{shapes[0][1]}x{shapes[0][2]}" if shapes else f"{side}x{side}"
    seeds = sorted({r.seed for r in study.runs if r.source == "tune"})
    setting = {
        "dataset": data.get("dataset", "?"),
        "image size": size,
        "epochs": params.get("train.epochs", "?"),
        "hidden": params.get("model.hidden", "?"),
        "layers": params.get("model.layers", "?"),
        "ffn": params.get("model.ffn", "?"),
        "learned dim": params.get("model.learned_dim", "?"),
        "ResNet width": params.get("model.resnet_width", "?"),
        "seeds": ", ".join(map(str, seeds)) or "none",
    }
    return {key: value for key, value in setting.items() if value != "?"}  # what the runs did not log is left out


def heads_table(study: LoadedStudy) -> pd.DataFrame:
    """``geometry.heads_frame`` of every self-attention model downloaded, with variant, seed, run_id."""
    frames = [
        heads_frame(r.model).assign(variant=r.variant, seed=r.seed, run_id=r.run_id)
        for r in study.runs
        if isinstance(r.model, SelfAttentionNet)
    ]
    columns = ["variant", "seed", "run_id", *HEADS_COLUMNS]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def distance_table(study: LoadedStudy) -> pd.DataFrame:
    """Mean attention distance (tokens) per variant, epoch and layer, averaged over seeds, from head histories."""
    frames = [
        distance_by_epoch(r.head_history, r.model.grid).assign(variant=r.variant, seed=r.seed)
        for r in study.runs
        if isinstance(r.model, SelfAttentionNet) and r.head_history
    ]
    columns = ["variant", "epoch", "layer", "mean_attention_distance"]
    if not frames:
        return pd.DataFrame(columns=columns)
    joined = pd.concat(frames, ignore_index=True)
    return joined.groupby(["variant", "epoch", "layer"], as_index=False, sort=False)["mean_attention_distance"].mean()


def _offsets(study: LoadedStudy, curves: pd.DataFrame) -> dict[str, float]:
    """Pruned variants start where their source runs ended (their last epoch), so the curve continues it."""
    offsets: dict[str, float] = {}
    for run in study.runs:
        source = study.run(run.source_run_id) if run.source_run_id else None
        if source is not None and math.isfinite(source.epochs) and run.variant in set(curves["variant"]):
            offsets[run.variant] = max(offsets.get(run.variant, 0.0), source.epochs)
    return offsets


class _Figures:
    """Builds each figure (or says why not), saves it, and collects its report entry."""

    def __init__(self, study: LoadedStudy, layout: Layout, outputs: Outputs) -> None:
        self.study, self.layout, self.outputs = study, layout, outputs

    def add(self, name: str, title: str, build: Callable[[], tuple[Figure, str] | str]) -> None:
        made = build()
        if isinstance(made, str):
            self.outputs.skipped.append(f"{title}: {made}")
            log.info("figure %s skipped: %s", name, made)
            return
        fig, sentence = made
        path = figures.save(fig, self.layout.figures / f"{name}.png")
        self.outputs.files.setdefault("figures", []).append(path)
        self.outputs.figures.append(FigureEntry(f"figures/{path.name}", title, sentence))
        log.info("figure %s written", path)

    def first(self, variant: str) -> LoadedRun | str:
        """The lowest-seed usable run of ``variant``, or why there is none."""
        usable = self.study.by_variant(variant)
        if usable:
            return usable[0]
        runs = self.study.by_variant(variant, usable=False)
        if not runs:
            return f"{variant} was not run" if variant != PRUNED else f"{variant}: no prune manifest yet"
        return f"{variant} has no completed run with a checkpoint ({runs[0].reason or runs[0].status})"


def _trajectories(fx: _Figures) -> tuple[Figure, str] | str:
    run = fx.first("sa_quadratic_9")
    if isinstance(run, str):
        return run
    if not run.head_history:
        return "sa_quadratic_9 has no head history"
    layer = len(run.model.layers) // 2
    frame = history_frame(run.head_history)
    frame = frame[frame["layer"] == layer]
    first, last = frame[frame["epoch"] == frame["epoch"].min()], frame[frame["epoch"] == frame["epoch"].max()]
    moved = np.hypot(
        last["centre_row"].to_numpy() - first["centre_row"].to_numpy(),
        last["centre_col"].to_numpy() - first["centre_col"].to_numpy(),
    ).mean()
    reach = np.hypot(last["centre_row"], last["centre_col"]).mean()
    title = f"Fig. 2: head centres of SA quadratic (9 heads), layer {layer + 1}, seed {run.seed}"
    fig = figures.head_trajectories(run.head_history, layer, title=title)
    sentence = (
        f"Each of the 9 heads of layer {layer + 1} (the middle layer) moves its attention centre from its random "
        f"initialisation (circle) to epoch {int(frame['epoch'].max())} (star): on average {moved:.2f} tokens, ending "
        f"{reach:.2f} tokens from the query. In the paper (layer 4, 300 epochs on CIFAR-10) the centres spread out "
        "to distinct shifts around the query, like the positions of a convolution kernel."
    )
    return fig, sentence


def _contours(fx: _Figures, variant: str, figure: str, pruned_from: str | None = None) -> tuple[Figure, str] | str:
    run = fx.first(variant)
    if isinstance(run, str):
        return run
    geometry = run.model.head_geometry()
    if geometry is None:
        return f"{variant} has no Gaussian heads"
    pruned: set[tuple[int, int]] = set()
    pruning = ""
    if pruned_from is not None:
        models = [r for r in fx.study.runs if r.variant == pruned_from and r.source_run_id == run.run_id]
        if models and models[0].pruned_heads:
            pruned = models[0].pruned_heads
            per_layer = [sum(1 for layer, _ in pruned if layer == i) for i in range(len(geometry))]
            pruning = (
                f" The prune stage cut {len(pruned)} heads (per layer {per_layer}; grey dashed with x); the paper cut "
                f"{sum(PAPER_PRUNED_HEADS)} of 54 (per layer {list(PAPER_PRUNED_HEADS)}), the degenerate ones."
            )
        else:
            pruning = " No heads are marked: " + ("no prune manifest yet." if not models else "none was pruned.")
    heads = heads_frame(run.model)
    distance = heads.groupby("layer")["mean_attention_distance"].mean()
    label = LABELS.get(variant, variant)
    title = f"{figure}: attention of each head of {label}, seed {run.seed}"
    fig = figures.head_contours(geometry, pruned=pruned, title=title)
    sentence = (
        f"Each head's Gaussian attention around the query pixel (50% and 90% of its mass) in every layer after "
        f"training; mean attention distance per layer {', '.join(f'{d:.2f}' for d in distance)} tokens. In the paper "
        "the heads of the early layers attend to distinct nearby shifts (a grid like a convolution kernel) and the "
        "deeper layers attend further and wider." + pruning
    )
    return fig, sentence


def _attention_maps(fx: _Figures) -> tuple[Figure, str] | str:
    run = fx.first("sa_learned_9")
    if isinstance(run, str):
        return run
    rows, cols = run.model.grid
    query = (rows // 2, cols // 2)
    with torch.no_grad():
        maps = run.model.attention_maps(query)
    peak = heads_frame(run.model).groupby("layer")["peak_probability"].mean()
    title = f"Fig. 6: attention of SA learned (9 heads), query token {query}, seed {run.seed}"
    fig = figures.attention_maps(maps, query, title=title)
    sentence = (
        f"Attention probabilities of every head (columns) of every layer (rows) for the central query token "
        f"{query} (red square) of the {rows}x{cols} token grid; mean peak probability per layer "
        f"{', '.join(f'{p:.2f}' for p in peak)}. In the paper some heads of the learned encoding's first layers "
        "attend to a few pixels next to the query, as a convolution would, while others and the deeper layers attend "
        "to wide, content-dependent regions."
    )
    return fig, sentence


def _accuracy(fx: _Figures, curves: pd.DataFrame) -> tuple[Figure, str] | str:
    if curves.empty:
        return "no completed run logged a test accuracy"
    offsets = _offsets(fx.study, curves)
    fig = figures.accuracy_curves(curves, labels=LABELS, offsets=offsets, title="Figs. 4/8: test accuracy")
    finals = []
    for variant in dict.fromkeys(curves["variant"]):
        last = curves[curves["variant"] == variant].sort_values("epoch").groupby("seed").tail(1)["test_acc"].mean()
        paper = PAPER_FIGURES[variant].accuracy if variant in PAPER_FIGURES else None
        finals.append(f"{LABELS.get(variant, variant)} {_fmt_pct(last)} (paper {_fmt_pct(paper or math.nan)})")
    pruned = (
        " The pruned model's curve starts right after pruning (its epoch 0) where its source run ended."
        if offsets
        else ""
    )
    sentence = (
        f"Test accuracy per epoch, mean over seeds; final: {'; '.join(finals)}. The paper's curves (300 epochs on "
        "CIFAR-10) reach 91.8-93.8% with the self-attention models close to ResNet18." + pruned
    )
    return fig, sentence


def _theorem(fx: _Figures) -> tuple[Figure, str]:
    generator = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    x = torch.randn(1, 3, 8, 8, generator=generator)
    points = theorem_error_vs_alpha(conv, x, THEOREM_ALPHAS)
    fig = figures.theorem_error(points, title="Theorem 1: attention heads built from a 3x3 convolution")
    sentence = (
        f"A 3x3 convolution (3->4 channels, 8x8 input) rebuilt as 9 quadratic-encoding attention heads: the largest "
        f"difference falls from {points[0][1]:.2g} at alpha={points[0][0]:g} to {points[-1][1]:.2g} at "
        f"alpha={points[-1][0]:g}. Theorem 1 proves the construction becomes exact as alpha grows; the paper states "
        "it without plotting it."
    )
    return fig, sentence


def _distance(distances: pd.DataFrame) -> tuple[Figure, str] | str:
    if distances.empty:
        return "no run with Gaussian heads kept a head history"
    fig = figures.attention_distance_curves(distances, labels=LABELS)
    changes = []
    for variant, rows in distances.groupby("variant", sort=False):
        by_epoch = rows.groupby("epoch")["mean_attention_distance"].mean()
        changes.append(f"{LABELS.get(variant, variant)} {by_epoch.iloc[0]:.2f} -> {by_epoch.iloc[-1]:.2f}")
    sentence = (
        "Beyond the paper: mean attention distance of each layer's heads (tokens) at every epoch, from the head "
        f"histories; averaged over layers, first -> last epoch: {'; '.join(changes)}. The paper's Figs. 3/7 show the "
        "end state: early layers local, deeper layers wider."
    )
    return fig, sentence


def _likeness(fx: _Figures, variant: str) -> tuple[Figure, str] | str:
    run = fx.first(variant)
    if isinstance(run, str):
        return run
    if not isinstance(run.model, SelfAttentionNet):
        return f"{variant} is not a self-attention model"
    heads = heads_frame(run.model)
    title = f"Convolution-likeness of {LABELS.get(variant, variant)}, seed {run.seed} (1 = attends to one shift)"
    fig = figures.convolution_likeness(heads, title=title)
    peak = heads["peak_probability"]
    sentence = (
        f"Beyond the paper: each head's peak attention probability (interior queries) in "
        f"{LABELS.get(variant, variant)}; mean {peak.mean():.2f}, {int((peak > 0.5).sum())} of "
        f"{len(heads)} heads above 0.5. A head of Theorem 1's convolution attends with probability ~1 to one shift; "
        "the paper's trained quadratic heads are sharp in early layers."
    )
    return fig, sentence


def write_outputs(study: LoadedStudy, setting: Mapping[str, Any], layout: Layout) -> Outputs:
    """Write every output under ``layout``; returns what was written (for MLflow) and the tables."""
    runs = study.frame()
    missing = {} if study.prune_parent_run_id else {PRUNED: "pruned row: no prune manifest yet"}
    table = accuracy_table(runs, missing_notes=missing)
    outputs = Outputs(table=table, heads=heads_table(study), summary=metrics_summary(runs))
    log.info("tables -> %s", layout.tables)
    outputs.files["tables"] = write_table(table, setting, layout.tables / "accuracy")
    runs_csv = layout.tables / "runs.csv"
    runs.to_csv(runs_csv, index=False)
    heads_csv = layout.tables / "heads.csv"
    outputs.heads.to_csv(heads_csv, index=False)
    outputs.files["tables"] += [runs_csv, heads_csv]
    outputs.files["metrics"] = [write_metrics(outputs.summary, layout.metrics)]

    log.info("plot data -> %s", layout.plots)
    curves = study.curves()
    distances = distance_table(study)
    layout.plots.mkdir(parents=True, exist_ok=True)
    curves.to_csv(layout.plots / "accuracy.csv", index=False)
    distances.to_csv(layout.plots / "attention_distance.csv", index=False)
    outputs.files["plots"] = [layout.plots / "accuracy.csv", layout.plots / "attention_distance.csv"]

    log.info("figures -> %s", layout.figures)
    for stale in layout.figures.glob("*.png") if layout.figures.is_dir() else []:
        stale.unlink()  # a figure skipped this time must not survive from an earlier run
    fx = _Figures(study, layout, outputs)
    fx.add("fig2_trajectories", "Fig. 2: head centres during training", lambda: _trajectories(fx))
    fx.add("fig3_contours_quadratic_9", "Fig. 3: SA quadratic, 9 heads",
           lambda: _contours(fx, "sa_quadratic_9", "Fig. 3"))  # fmt: skip
    fx.add("fig10_contours_quadratic_16", "Fig. 10: SA quadratic, 16 heads",
           lambda: _contours(fx, "sa_quadratic_16", "Fig. 10"))  # fmt: skip
    fx.add("fig7_contours_generalized_pruned", "Fig. 7: SA quadratic generalized, pruned heads marked",
           lambda: _contours(fx, "sa_generalized_9", "Fig. 7", pruned_from=PRUNED))  # fmt: skip
    fx.add("fig6_attention_learned", "Fig. 6: attention maps of SA learned", lambda: _attention_maps(fx))
    fx.add("fig4_accuracy", "Figs. 4/8: test accuracy during training", lambda: _accuracy(fx, curves))
    fx.add("theorem1_error_vs_alpha", "Theorem 1: error vs alpha", lambda: _theorem(fx))
    fx.add("attention_distance", "Mean attention distance per layer during training", lambda: _distance(distances))
    for variant in ("sa_quadratic_9", "sa_quadratic_16", "sa_generalized_9", "sa_learned_9"):
        fx.add(f"conv_likeness_{variant}", f"Convolution-likeness: {LABELS[variant]}",
               lambda variant=variant: _likeness(fx, variant))  # fmt: skip

    notes = [f"{r.variant} seed {r.seed} (run {r.run_id}): {r.reason}" for r in study.runs if r.reason]
    table_md = to_markdown(table, setting).split("\n", 2)[2]  # without its setting line: the report's first line
    write_text_atomic(layout.report, render_report(setting, table_md, outputs.figures, outputs.skipped, notes))
    outputs.files["report"] = [layout.report]
    log.info("report -> %s", layout.report)
    return outputs
