"""Every output of the analysis stage from a loaded study: tables, figures, plot data, metrics and the report.

Generic over variants: whatever the manifests name (the sweep's variants, grids expanded, and the pruned models) is a
row of the tables, an entry of ``metrics.json``, a series of the plot data and of every curve figure, and gets its
own figures (head contours for Gaussian encodings, attention maps otherwise, and convolution-likeness). The paper's
figures are those of the paper's models, titled with the paper's figure number. One epoch axis everywhere: a pruned
model's fine-tuning epoch k is drawn and written at its source's last epoch + k (its epoch 0, right after pruning,
at the source's last epoch). No MLflow here (``analysis.runs`` fetches the runs); a figure whose model has no usable
run is skipped with a line saying so, in the log and in the report.
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
from analysis.geometry import HEADS_COLUMNS, heads_frame, history_frame
from analysis.report import FigureEntry, Section, render_report
from analysis.runs import LoadedRun, LoadedStudy
from analysis.table import (
    CONV_LIKE_MAX_DISTANCE,
    CONV_LIKE_RULE,
    accuracy_table,
    as_integers,
    conv_like_table,
    format_conv_like,
    metrics_summary,
    quoted_table,
    size_metrics,
    to_markdown,
    write_metrics,
    write_table,
)
from analysis.variants import Variant, describe_variants
from pipeline.io import write_text_atomic
from pipeline.measure.reference import PAPER_FIGURES, PAPER_PRUNED_HEADS
from pipeline.models.conv_to_attention import theorem_error_vs_alpha
from pipeline.models.sa_net import SelfAttentionNet

log = logging.getLogger(__name__)

THEOREM_ALPHAS = [0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0]
# The paper's figure of each of its models' per-variant figure (contours, or attention maps for the learned one).
PAPER_FIGURE_NUMBERS = {
    "sa_quadratic_9": "Fig. 3",
    "sa_quadratic_16": "Fig. 10",
    "sa_generalized_9": "Fig. 7",
    "sa_learned_9": "Fig. 6",
}
PLOT_KEYS = ["variant", "model", "colour", "seed", "epoch"]  # the first columns of every plot-data CSV


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
    conv_like: pd.DataFrame = field(default_factory=pd.DataFrame)
    files: dict[str, list[Path]] = field(default_factory=dict)  # MLflow artifact folder -> files
    figures: list[FigureEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _fmt_pct(value: float) -> str:
    return f"{100 * value:.1f}%" if math.isfinite(value) else "–"


def _shared(values: list[Any]) -> Any:
    """One value when the runs agree, else every value (``32/64``): variants may set their own widths."""
    distinct = list(dict.fromkeys(v for v in values if v is not None))
    return "?" if not distinct else distinct[0] if len(distinct) == 1 else "/".join(map(str, sorted(distinct, key=str)))


def setting_of(data: Mapping[str, Any], study: LoadedStudy) -> dict[str, Any]:
    """What was trained: dataset (params.yaml ``data``), image size (the checkpoints'), and from the runs' own params
    the epochs, widths and seeds (``a/b`` where variants differ: their names say which is which)."""
    tune = [r.params for r in study.runs if r.params and r.source == "tune"]
    attention = [p for p in tune if p.get("model.arch", "sa") == "sa"]
    shapes = [r.image_shape for r in study.runs if r.image_shape]
    side = data.get("image_size", "?")
    size = f"{shapes[0][1]}x{shapes[0][2]}" if shapes else f"{side}x{side}"
    seeds = sorted({r.seed for r in study.runs if r.source == "tune"})
    setting = {
        "dataset": data.get("dataset", "?"),
        "image size": size,
        "epochs": _shared([p.get("train.epochs") for p in tune]),
        "hidden": _shared([p.get("model.hidden") for p in attention]),
        "layers": _shared([p.get("model.layers") for p in attention]),
        "ffn": _shared([p.get("model.ffn") for p in attention]),
        "learned dim": _shared([p.get("model.learned_dim") for p in attention if p.get("model.encoding") == "learned"]),
        "ResNet width": _shared([p.get("model.resnet_width") for p in tune if p.get("model.arch") == "resnet18"]),
        "seeds": ", ".join(map(str, seeds)) or "none",
    }
    return {key: value for key, value in setting.items() if value != "?"}  # what the runs did not log is left out


def heads_table(study: LoadedStudy) -> pd.DataFrame:
    """``geometry.heads_frame`` of every self-attention model downloaded, with variant, seed, run_id; the locality
    columns are the trial's last measurement when the run kept its history."""
    frames = [
        heads_frame(r.model, r.locality_history[-1]["layers"] if r.locality_history else None).assign(
            variant=r.variant, seed=r.seed, run_id=r.run_id
        )
        for r in study.runs
        if isinstance(r.model, SelfAttentionNet)
    ]
    columns = ["variant", "seed", "run_id", *HEADS_COLUMNS]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def epoch_offsets(study: LoadedStudy) -> dict[str, float]:
    """Per pruned variant, the epoch its fine-tuning starts from on the study's axis: its source runs' last epoch."""
    offsets: dict[str, float] = {}
    for run in study.runs:
        source = study.run(run.source_run_id) if run.source_run_id else None
        if source is not None and math.isfinite(source.epochs):
            offsets[run.variant] = max(offsets.get(run.variant, 0.0), source.epochs)
    return offsets


def on_study_axis(frame: pd.DataFrame, offsets: Mapping[str, float]) -> pd.DataFrame:
    """``frame`` (columns variant, epoch, ...) with each variant's epochs moved by its offset (``epoch_offsets``)."""
    if frame.empty:
        return frame
    shift = frame["variant"].map(lambda v: int(offsets.get(v, 0)))
    return frame.assign(epoch=(frame["epoch"] + shift).astype(int))


def plot_frame(frame: pd.DataFrame, variants: list[Variant]) -> pd.DataFrame:
    """Plot data for ``dvc plots``: the display name and fixed colour of each row's variant first (the templates
    colour each variant's series with its own colour), variants in the study's order."""
    info = {v.name: v for v in variants}
    rows = frame[frame["variant"].isin(info)]
    order = {v.name: i for i, v in enumerate(variants)}
    rows = rows.assign(
        model=rows["variant"].map(lambda v: info[v].label), colour=rows["variant"].map(lambda v: info[v].style.colour)
    ).sort_values(["variant", "seed", "epoch"], key=lambda c: c.map(order) if c.name == "variant" else c)
    rest = [c for c in frame.columns if c not in PLOT_KEYS]
    return rows[PLOT_KEYS + rest].reset_index(drop=True)


class _Figures:
    """Builds each figure (or says why not), saves it, and collects its report entry."""

    def __init__(self, study: LoadedStudy, layout: Layout, outputs: Outputs, variants: list[Variant]) -> None:
        self.study, self.layout, self.outputs = study, layout, outputs
        self.variants = {v.name: v for v in variants}

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
            return f"{variant} was not run"
        return f"{variant} has no completed run with a checkpoint ({runs[0].reason or runs[0].status})"

    def label(self, variant: str) -> str:
        return self.variants[variant].label if variant in self.variants else variant


def _trajectories(fx: _Figures) -> tuple[Figure, str] | str:
    gaussian = [v for v, info in fx.variants.items() if info.config.get("encoding") == "quadratic"]
    variant = "sa_quadratic_9" if "sa_quadratic_9" in gaussian else next(iter(gaussian), None)
    if variant is None:
        return "no quadratic-encoding variant was run"
    run = fx.first(variant)
    if isinstance(run, str):
        return run
    if not run.head_history:
        return f"{variant} has no head history"
    layer = len(run.model.layers) // 2 + 1  # the middle layer (the paper's layer 4 of 6)
    frame = history_frame(run.head_history)
    frame = frame[frame["layer"] == layer]
    first, last = frame[frame["epoch"] == frame["epoch"].min()], frame[frame["epoch"] == frame["epoch"].max()]
    moved = np.hypot(
        last["centre_row"].to_numpy() - first["centre_row"].to_numpy(),
        last["centre_col"].to_numpy() - first["centre_col"].to_numpy(),
    ).mean()
    reach = np.hypot(last["centre_row"], last["centre_col"]).mean()
    heads = frame["head"].nunique()
    title = f"Fig. 2: head centres of {fx.label(variant)}, layer {layer}, seed {run.seed}"
    fig = figures.head_trajectories(run.head_history, layer, title=title)
    sentence = (
        f"Each of the {heads} heads of layer {layer} (the middle layer) moves its attention centre from its random "
        f"initialisation (circle) to epoch {int(frame['epoch'].max())} (star): on average {moved:.2f} tokens, ending "
        f"{reach:.2f} tokens from the query. In the paper (layer 4, 300 epochs on CIFAR-10) the centres spread out "
        "to distinct shifts around the query, like the positions of a convolution kernel."
    )
    return fig, sentence


def _pruned_marks(fx: _Figures, variant: str, run: LoadedRun, layers: int) -> tuple[set[tuple[int, int]], str]:
    """The heads cut from ``run`` by the prune stage (as (layer, head) indices from 0) and a sentence about them."""
    pruned_variant = f"{variant}_pruned"
    if pruned_variant not in fx.variants:
        return set(), ""
    models = [r for r in fx.study.runs if r.variant == pruned_variant and r.source_run_id == run.run_id]
    if not models or not models[0].pruned_heads:
        return set(), " No heads are marked: " + ("none was pruned." if models else "another seed was pruned.")
    pruned = models[0].pruned_heads
    per_layer = [sum(1 for layer, _ in pruned if layer == i) for i in range(layers)]
    sentence = f" The prune stage cut {len(pruned)} heads (per layer {per_layer}; grey dashed with x)"
    if variant == "sa_generalized_9":
        paper = list(PAPER_PRUNED_HEADS)
        sentence += f"; the paper cut {sum(paper)} of 54 (per layer {paper}), the degenerate ones"
    return pruned, sentence + "."


def _contours(fx: _Figures, variant: str) -> tuple[Figure, str] | str:
    run = fx.first(variant)
    if isinstance(run, str):
        return run
    geometry = run.model.head_geometry()
    pruned, pruning = _pruned_marks(fx, variant, run, len(geometry))
    if variant == "sa_generalized_9" and not pruning:
        pruning = " No heads are marked: no prune manifest yet." if not fx.study.prune_parent_run_id else pruning
    distance = heads_table_of(run).groupby("layer")["mean_distance"].mean()
    figure = PAPER_FIGURE_NUMBERS.get(variant)
    title = f"{figure + ': a' if figure else 'A'}ttention of each head of {fx.label(variant)}, seed {run.seed}"
    fig = figures.head_contours(geometry, pruned=pruned, title=title)
    sentence = (
        f"Each head's Gaussian attention around the query pixel (50% and 90% of its mass) in every layer after "
        f"training; mean attention distance per layer {', '.join(f'{d:.2f}' for d in distance)} tokens. In the paper "
        "the heads of the early layers attend to distinct nearby shifts (a grid like a convolution kernel) and the "
        "deeper layers attend further and wider." + pruning
    )
    return fig, sentence


def heads_table_of(run: LoadedRun) -> pd.DataFrame:
    """``heads_frame`` of one run, with the trial's last locality measurement when it has one."""
    return heads_frame(run.model, run.locality_history[-1]["layers"] if run.locality_history else None)


def _attention_maps(fx: _Figures, variant: str) -> tuple[Figure, str] | str:
    run = fx.first(variant)
    if isinstance(run, str):
        return run
    rows, cols = run.model.grid
    query = (rows // 2, cols // 2)
    with torch.no_grad():
        maps = run.model.attention_maps(query)
    peak = heads_table_of(run).groupby("layer")["peak_probability"].mean()
    figure = PAPER_FIGURE_NUMBERS.get(variant)
    title = f"{figure + ': a' if figure else 'A'}ttention of {fx.label(variant)}, query token {query}, seed {run.seed}"
    fig = figures.attention_maps(maps, query, title=title)
    sentence = (
        f"Attention probabilities of every head (columns) of every layer (rows) for the central query token "
        f"{query} (red square) of the {rows}x{cols} token grid, on one logarithmic colour scale; mean peak "
        f"probability per layer {', '.join(f'{p:.2f}' for p in peak)}. In the paper some heads of the learned "
        "encoding's first layers attend to a few pixels next to the query, as a convolution would, while others and "
        "the deeper layers attend to wide regions."
    )
    return fig, sentence


def _accuracy(fx: _Figures, curves: pd.DataFrame, markers: dict[str, float]) -> tuple[Figure, str] | str:
    if curves.empty:
        return "no completed run logged a test accuracy"
    variants = [v for v in fx.variants.values() if v.name in set(curves["variant"])]
    fig = figures.accuracy_curves(curves, variants, markers=markers, title="Figs. 4/8: test accuracy")
    finals = []
    for variant in variants:
        runs = curves[curves["variant"] == variant.name].sort_values("epoch").groupby("seed").tail(1)
        if variant.paper is None:
            reference = "not in the paper"
        elif variant.paper.accuracy is None:
            reference = "the paper gives no accuracy"
        else:
            reference = f"paper {_fmt_pct(variant.paper.accuracy)}"
        finals.append(f"{variant.label} {_fmt_pct(runs['test_acc'].mean())} ({reference})")
    pruned = " A pruned model's curve starts right after pruning where its source run ended." if markers else ""
    sentence = (
        f"Test accuracy per epoch, mean over seeds; final: {'; '.join(finals)}. The paper's curves (300 epochs on "
        "CIFAR-10) reach 91.8-93.8% with the self-attention models close to ResNet18." + pruned
    )
    return fig, sentence


def _locality(fx: _Figures, locality: pd.DataFrame, offsets: dict[str, float]) -> tuple[Figure, str] | str:
    if locality.empty:
        return "no self-attention run kept a locality history"
    variants = [v for v in fx.variants.values() if v.name in set(locality["variant"])]
    markers = {v: {"pruning": offset} for v, offset in offsets.items()}
    threshold = (CONV_LIKE_MAX_DISTANCE, f"convolution-like: <= {CONV_LIKE_MAX_DISTANCE} tokens")
    fig = figures.locality_curves(locality, variants, threshold=threshold, markers=markers)
    changes = []
    for variant in variants:
        by_epoch = locality[locality["variant"] == variant.name].groupby("epoch")["mean_distance"].mean()
        changes.append(f"{variant.label} {by_epoch.iloc[0]:.2f} -> {by_epoch.iloc[-1]:.2f}")
    sentence = (
        "Beyond the paper: each layer's mean attention distance (tokens; the mean over its heads), measured by the "
        "trial on each layer's own input at every epoch (epoch 0: before training) and logged to MLflow as "
        f"`locality/layer<l>/mean_distance`; averaged over layers, first -> last epoch: {'; '.join(changes)}. The "
        f"dotted line is the convolution-like threshold: {CONV_LIKE_RULE}. The paper's Figs. 3/7 show the end "
        "state: early layers local, deeper layers wider."
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


def _likeness(fx: _Figures, variant: str) -> tuple[Figure, str] | str:
    run = fx.first(variant)
    if isinstance(run, str):
        return run
    heads = heads_table_of(run)
    title = f"Convolution-likeness of {fx.label(variant)}, seed {run.seed} (1 = attends to one shift)"
    fig = figures.convolution_likeness(heads, title=title)
    peak = heads["peak_probability"]
    sentence = (
        f"Beyond the paper: each head's peak attention probability (interior queries) in {fx.label(variant)}; mean "
        f"{peak.mean():.2f}, {int((peak > 0.5).sum())} of {len(heads)} heads above 0.5. A head of Theorem 1's "
        "convolution attends with probability ~1 to one shift; the paper's trained quadratic heads are sharp in early "
        "layers."
    )
    return fig, sentence


def _write_plots(layout: Layout, curves: pd.DataFrame, locality: pd.DataFrame, variants: list[Variant]) -> list[Path]:
    """``accuracy.csv`` and ``locality.csv``: tidy rows (variant, model, colour, seed, epoch, values) on the study's
    epoch axis, which ``dvc.yaml``'s plots draw one series per variant in its own colour."""
    layout.plots.mkdir(parents=True, exist_ok=True)
    paths = [layout.plots / "accuracy.csv", layout.plots / "locality.csv"]
    for stale in (layout.plots / "attention_distance.csv",):  # an earlier version's file, no longer a DVC plot
        stale.unlink(missing_ok=True)
    plot_frame(curves, variants).to_csv(paths[0], index=False)
    plot_frame(locality, variants).to_csv(paths[1], index=False)
    return paths


def _conv_like_section(conv_like: pd.DataFrame) -> Section:
    shown = format_conv_like(conv_like)
    body = (
        shown.to_markdown(index=False, disable_numparse=True)
        if len(shown)
        else "No self-attention run kept a locality history."
    )
    intro = (
        f"Heads per layer whose last measured {CONV_LIKE_RULE}, out of the layer's heads (mean over seeds when "
        "several): the heads that look no further than a small convolution kernel. Per head: `tables/heads.csv`."
    )
    return Section("Convolution-like heads per layer", f"{intro}\n\n{body}")


def write_outputs(study: LoadedStudy, setting: Mapping[str, Any], layout: Layout) -> Outputs:
    """Write every output under ``layout``; returns what was written (for MLflow) and the tables."""
    variants = describe_variants(study.configs())
    runs = study.frame()
    table = accuracy_table(runs, variants)
    heads = heads_table(study)
    locality = study.locality()
    conv_like = conv_like_table(
        heads[["variant", "seed", "layer", "head", "mean_distance"]] if len(heads) else heads, variants
    )
    outputs = Outputs(table=table, heads=heads, summary=metrics_summary(runs, variants), conv_like=conv_like)
    log.info("tables -> %s", layout.tables)
    outputs.files["tables"] = write_table(table, setting, layout.tables / "accuracy")
    extra = {"runs.csv": as_integers(runs), "heads.csv": heads, "conv_like_heads.csv": as_integers(conv_like)}
    for name, frame in extra.items():
        frame.to_csv(layout.tables / name, index=False)
        outputs.files["tables"].append(layout.tables / name)
    outputs.files["metrics"] = [write_metrics(size_metrics(outputs.summary), layout.metrics)]

    offsets = epoch_offsets(study)
    curves = on_study_axis(study.curves(), offsets)
    locality = on_study_axis(locality, offsets)
    log.info("plot data -> %s", layout.plots)
    outputs.files["plots"] = _write_plots(layout, curves, locality, variants)

    log.info("figures -> %s", layout.figures)
    for stale in layout.figures.glob("*.png") if layout.figures.is_dir() else []:
        stale.unlink()  # a figure skipped this time must not survive from an earlier run
    fx = _Figures(study, layout, outputs, variants)
    markers = {
        "pruning" if len(set(offsets.values())) == 1 else f"{fx.label(v)}: pruning": epoch
        for v, epoch in offsets.items()
    }
    fx.add("fig4_accuracy", "Figs. 4/8: test accuracy during training", lambda: _accuracy(fx, curves, markers))
    fx.add(
        "locality_distance",
        "Mean attention distance per layer during training",
        lambda: _locality(fx, locality, offsets),
    )
    fx.add("fig2_trajectories", "Fig. 2: head centres during training", lambda: _trajectories(fx))
    for variant in (v for v in variants if v.is_attention):
        build = _contours if variant.config.get("encoding") in ("quadratic", "generalized_quadratic") else None
        figure = PAPER_FIGURE_NUMBERS.get(variant.name)
        prefix = f"{figure}: " if figure else ""
        if build is not None:
            fx.add(
                f"contours_{variant.name}",
                f"{prefix}{'head' if prefix else 'Head'} contours of {variant.label}",
                lambda v=variant.name: _contours(fx, v),
            )
        else:
            fx.add(
                f"attention_{variant.name}",
                f"{prefix}{'attention' if prefix else 'Attention'} maps of {variant.label}",
                lambda v=variant.name: _attention_maps(fx, v),
            )
        fx.add(
            f"conv_likeness_{variant.name}",
            f"Convolution-likeness: {variant.label}",
            lambda v=variant.name: _likeness(fx, v),
        )
    fx.add("theorem1_error_vs_alpha", "Theorem 1: error vs alpha", lambda: _theorem(fx))

    notes = [f"{r.variant} seed {r.seed} (run {r.run_id}): {r.reason}" for r in study.runs if r.reason]
    not_run = [f.label for name, f in PAPER_FIGURES.items() if name not in {v.name for v in variants}]
    if not study.prune_parent_run_id:
        notes.append("no prune manifest yet: the pruned models and Fig. 7's marks wait for the prune stage")
    table_md = to_markdown(table, setting).split("\n", 2)[2]  # without its setting line: the report's first line
    sections = [_conv_like_section(conv_like)]
    quoted = quoted_table().to_markdown(index=False, disable_numparse=True)
    report = render_report(setting, table_md, outputs.figures, outputs.skipped, notes, sections, not_run, quoted)
    write_text_atomic(layout.report, report)
    outputs.files["report"] = [layout.report]
    log.info("report -> %s", layout.report)
    return outputs
