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
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from analysis import figures
from analysis.band import band_section_body
from analysis.beyond_paper import write_beyond_paper
from analysis.cka_report import write_cka
from analysis.claims import Evidence, claims, claims_table, run_link, theorem_case
from analysis.compute import compute_section_body, study_compute
from analysis.data_size import write_data_size
from analysis.gaussian_locality import CONV_LIKE_MAX_DISTANCE, CONV_LIKE_RULE
from analysis.geometry import HEADS_COLUMNS, heads_frame
from analysis.head_motion import (
    LAYER_COLUMNS,
    MIN_PEAK,
    RADIUS,
    TOLERANCE,
    finding_summary,
    gap_to_baseline,
    motion_frame,
    uniform_heads,
)
from analysis.noise import difference_noise, within_noise
from analysis.prune_rule import describe_rule, is_papers_rule, not_comparable_note
from analysis.report import FigureEntry, Section, render_report
from analysis.runs import HISTORY_SEEDS, LoadedRun, LoadedStudy
from analysis.table import (
    accuracy_table,
    as_integers,
    conv_like_table,
    format_conv_like,
    mark_not_comparable,
    metrics_summary,
    quoted_table,
    size_metrics,
    to_markdown,
    write_metrics,
    write_table,
)
from analysis.transform_report import write_transform
from analysis.variants import Variant, describe_variants
from pipeline.encodings import PAPER_VARIANT_FIELDS, encoding_fields
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
BASELINE = "resnet18"  # the accuracy gap's reference; else the first variant with arch resnet18
FIG2_VARIANT = "sa_quadratic_9"  # the model of the paper's Fig. 2
REPORTED_SEEDS = 5  # per variant, the seeds whose head measures the report's finding table lists (the CSV: all)


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


def seed_ranges(seeds: list[int]) -> str:
    """``0, 1`` and ``0-166, 200``: three or more consecutive seeds as a range, so a study of a thousand seeds has a
    setting line a reader can read."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][-1] + 1:
            spans[-1].append(seed)
        else:
            spans.append([seed])
    return ", ".join(f"{s[0]}-{s[-1]}" if len(s) > 2 else ", ".join(map(str, s)) for s in spans)


def setting_of(data: Mapping[str, Any], study: LoadedStudy) -> dict[str, Any]:
    """What was trained: dataset (params.yaml ``data``), image size and attention tokens (the checkpoints'), from the
    runs' own params the epochs, widths and seeds, and the device they trained on (their ``device`` tag) (``a/b``
    where variants differ: their names say which is which)."""
    tune = [r.params for r in study.runs if r.params and r.source == "tune"]
    attention = [p for p in tune if p.get("model.arch", "sa") == "sa"]
    shapes = [r.image_shape for r in study.runs if r.image_shape]
    side = data.get("image_size", "?")
    size = f"{shapes[0][1]}x{shapes[0][2]}" if shapes else f"{side}x{side}"
    seeds = sorted({r.seed for r in study.runs if r.source == "tune"})
    models = [r.structure for r in study.runs if r.has_model]
    grids = [(m.grid, m.downsample) for m in models if isinstance(m, SelfAttentionNet)]
    setting = {
        "dataset": data.get("dataset", "?"),
        "image size": size,
        "tokens": _shared([f"{g[0]}x{g[1]} of {d}x{d} px" for g, d in grids]),
        "epochs": _shared([p.get("train.epochs") for p in tune]),
        "hidden": _shared([p.get("model.hidden") for p in attention]),
        "layers": _shared([p.get("model.layers") for p in attention]),
        "ffn": _shared([p.get("model.ffn") for p in attention]),
        **{
            field.replace("_", " "): _shared([p.get(f"model.{field}") for p in attention if f"model.{field}" in p])
            for field in encoding_fields()
        },
        "ResNet width": _shared([p.get("model.resnet_width") for p in tune if p.get("model.arch") == "resnet18"]),
        "device": _shared([r.tags.get("device") for r in study.runs if r.source == "tune"]),
        "seeds": seed_ranges(seeds) or "none",
    }
    return {key: value for key, value in setting.items() if value != "?"}  # what the runs did not log is left out


def heads_table(study: LoadedStudy) -> pd.DataFrame:
    """``geometry.heads_frame`` of every self-attention run with a model, with variant, seed, run_id; the locality
    columns are the trial's last measurement when the run kept its history."""
    frames = [
        heads_table_of(r).assign(variant=r.variant, seed=r.seed, run_id=r.run_id)
        for r in study.runs
        if r.has_model and isinstance(r.structure, SelfAttentionNet)
    ]
    columns = ["variant", "seed", "run_id", *HEADS_COLUMNS]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def head_motions(study: LoadedStudy) -> dict[str, pd.DataFrame]:
    """Per trained run (by run id) with a head history from its initialisation: ``head_motion.motion_frame`` (layers
    from 0). Every epoch for each variant's lowest-seed usable run (the one its figures draw), the initialisation and
    the last epoch for the others: all that ``finding_summary`` reads, so a study of a thousand seeds measures two
    snapshots per run, not every epoch's. Pruned models are left out: their fine-tuning starts from a trained model,
    not from an initialisation."""
    variants = dict.fromkeys(r.variant for r in study.runs)
    drawn = {usable[0].run_id for variant in variants if (usable := study.by_variant(variant))}
    motions = {}
    for run in study.runs:
        if run.source != "tune" or not run.head_history or not run.has_model:
            continue
        history = run.head_history
        if run.run_id not in drawn and len(history) > 2:
            history = [history[0], history[-1]]
        try:
            motions[run.run_id] = motion_frame(history)
        except ValueError as err:  # a history that does not start at the initialisation, or mismatched heads
            log.warning("head motion of %s seed %d (run %s) not measured: %s", run.variant, run.seed, run.run_id, err)
    return motions


def head_motion_table(study: LoadedStudy, motions: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Every epoch's per-layer head measures of every run in ``motions``: variant, seed, run_id, then
    ``head_motion.LAYER_COLUMNS`` with layers numbered from 1 (as every figure and CSV shows them)."""
    frames = [
        frame.assign(layer=frame["layer"] + 1, variant=run.variant, seed=run.seed, run_id=run.run_id)
        for run in study.runs
        if (frame := motions.get(run.run_id)) is not None and len(frame)
    ]
    columns = ["variant", "seed", "run_id", *LAYER_COLUMNS]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def baseline_of(variants: list[Variant]) -> str | None:
    """The accuracy gap's reference: ``resnet18`` when run, else the first ResNet18 variant, else None."""
    names = [v.name for v in variants if v.config.get("arch") == "resnet18"]
    return BASELINE if BASELINE in names else next(iter(names), None)


def accuracy_gaps(summary: Mapping[str, Mapping[str, Any]], variants: list[Variant]) -> tuple[str | None, dict]:
    """(baseline, per self-attention variant its gap in points: the baseline's mean final test accuracy minus its
    own, ``head_motion.gap_to_baseline``; NaN where either has no completed run)."""
    baseline = baseline_of(variants)
    if baseline is None:
        return None, {}
    accuracies = {
        name: math.nan if row.get("test_acc_mean") is None else float(row["test_acc_mean"])
        for name, row in summary.items()
    }
    accuracies.setdefault(baseline, math.nan)
    attention = {v.name for v in variants if v.is_attention}
    return baseline, {name: gap for name, gap in gap_to_baseline(accuracies, baseline).items() if name in attention}


def _fmt_gap(gap: float) -> str:
    return f"{gap:.1f} points" if math.isfinite(gap) else "not measured"


def _layer_note(row: pd.Series) -> str:
    return f"moved {row.displacement:.2f}, {int(row.heads_at_distinct_shifts)} of {int(row.heads)} at distinct shifts"


def _gap_sentence(fx: _Figures, baseline: str | None, gaps: Mapping[str, float]) -> str:
    """Each self-attention variant's accuracy gap to the baseline, its accuracy, and the paper's own gap."""
    if baseline is None:
        return "Accuracy gap to ResNet18: not measured, ResNet18 was not run."
    base = fx.outputs.summary.get(baseline, {}).get("test_acc_mean")
    if base is None:
        return f"Accuracy gap to {fx.label(baseline)}: not measured, {fx.label(baseline)} has no completed run."
    paper_base = fx.variants[baseline].paper if baseline in fx.variants else None
    parts = []
    for name, gap in gaps.items():
        acc = fx.outputs.summary.get(name, {}).get("test_acc_mean")
        text = f"{fx.label(name)} {_fmt_gap(gap)}" + (f" ({100 * acc:.2f}%)" if math.isfinite(gap) else "")
        if math.isfinite(gap) and fx.test_images and within_noise(base, acc, fx.test_images):
            text += f", within the test set's noise (±{100 * difference_noise(base, acc, fx.test_images):.1f})"
        paper = fx.variants[name].paper if name in fx.variants else None
        other_rule = name in fx.variants and fx.variants[name].pruned_from and not is_papers_rule(fx.study.prune_rule)
        if other_rule:
            text += ", not the paper's pruning rule"
        elif paper is not None and paper.accuracy is not None and paper_base is not None and paper_base.accuracy:
            text += f", paper {100 * (paper_base.accuracy - paper.accuracy):.1f}"
        parts.append(text)
    return (
        f"Accuracy gap to {fx.label(baseline)} ({100 * base:.2f}%) on the same data and epochs: its mean final test "
        "accuracy minus the variant's, in points (the paper's gap, CIFAR-10 after 300 epochs, beside it): "
        + ("; ".join(parts) or "no self-attention variant was run")
        + "."
    )


def _finding_section(
    fx: _Figures, summaries: Mapping[str, pd.DataFrame], baseline: str | None, gaps: Mapping[str, float]
) -> Section:
    """The paper's finding as numbers (``analysis.head_motion``), per Gaussian-encoding run and layer, the accuracy
    gap of every self-attention variant, and (as the section's figures, added by the caller) Fig. 2."""
    intro = (
        "The paper's claim (Section 4.2): trained from a random initialisation, the quadratic heads of the first "
        "layers move to distinct shifts around the query pixel and sharpen there, like the taps of a convolution "
        "kernel. Measured here from each run's own head history (every head's centre and Sigma^-1 per epoch, "
        "epoch 0 = initialisation; `tables/head_motion.csv` has every epoch of each variant's lowest seed) by "
        "`analysis/head_motion.py`, in tokens (one token = one attention-grid position), init -> last epoch. "
        "Every locality number is the head's own Gaussian for a query with all its keys (an unbounded grid, "
        "`analysis/gaussian_locality.py`), so it means the same on any grid; the trial's own measure, truncated at "
        "the grid's borders, is the locality figure's. Degenerate heads (largest eigenvalue of Sigma^-1 below the "
        "paper's 1e-5: they attend uniformly and their centre means nothing) are named under the table and left "
        "out of every mean and count. A thin stripe (the "
        "generalized encoding's heads with condition numbers above 1e3) is summed over a window of 64 tokens along "
        "its line and reads a distance of 10 or more: it does look far, and one such head moves its layer's mean:\n\n"
        "- **displacement**: mean distance of the layer's head centres from where they were initialised;\n"
        "- **centre to query**: mean distance of the head centres from the query;\n"
        "- **attention distance**: mean over heads of E[||key - query||] under the head's attention;\n"
        "- **peak**: mean over heads of the largest attention probability;\n"
        f"- **heads at distinct shifts**: how many different integer shifts s (max(|s_row|, |s_col|) <= {RADIUS}, a "
        f"{2 * RADIUS + 1}x{2 * RADIUS + 1} neighbourhood of the query) the sharp heads (peak >= {MIN_PEAK:g}) put "
        "most of their mass on: two heads on one shift count once;\n"
        "- **by position**: the same count over every head, sharp or not: beside the sharp count it shows whether "
        "training moved the heads (position) or sharpened them already in place;\n"
        f"- **kernel taps / shifts**: sharp heads within {TOLERANCE:g} token of an integer shift in that "
        "neighbourhood, and how many different shifts they occupy."
    )
    rows = []
    runs = reported_runs(fx, summaries)
    for run in runs:
        for i, row in enumerate(summaries[str(run.run_id)].itertuples()):
            rows.append(
                {
                    "model": fx.label(run.variant) if i == 0 else "",
                    "seed": str(run.seed) if i == 0 else "",
                    "layer": str(row.layer),
                    "displacement": f"{row.displacement:.2f}",
                    "centre to query": f"{row.centre_norm_init:.2f} -> {row.centre_norm:.2f}",
                    "attention distance": f"{row.mean_attention_distance_init:.2f} -> "
                    f"{row.mean_attention_distance:.2f}",
                    "peak": f"{row.peak_probability_init:.2f} -> {row.peak_probability:.2f}",
                    "heads at distinct shifts": f"{row.heads_at_distinct_shifts_init} -> "
                    f"{row.heads_at_distinct_shifts} of {row.heads - row.degenerate}",
                    "by position": f"{row.shifts_by_position_init} -> {row.shifts_by_position}",
                    "kernel taps / shifts": f"{row.kernel_heads} / {row.distinct_shifts}",
                }
            )
    table = (
        pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)
        if rows
        else "No run of a Gaussian encoding (quadratic, generalized quadratic) kept a head history."
    )
    more = len({r.run_id for r in fx.study.runs if len(summaries.get(str(r.run_id), ()))}) - len(runs)
    if more:
        table += (
            f"\n\nAnd {more} runs of later seeds, in `tables/head_motion.csv` (their initialisation and last epoch); "
            "the claims table gives their verdicts across seeds."
        )
    gap_text = _uniform_sentence(fx, runs) + _gap_sentence(fx, baseline, gaps)
    return Section(
        "The paper's finding, measured: heads move to distinct shifts near the query",
        f"{intro}\n\n{table}\n\n{gap_text}",
    )


def reported_runs(fx: _Figures, summaries: Mapping[str, pd.DataFrame]) -> list[LoadedRun]:
    """The runs the report's finding table lists, in the study's order (the paper's models first), each variant's
    ``REPORTED_SEEDS`` lowest seeds with a summary: a study of a thousand seeds gets a table a reader can read."""
    order = {name: i for i, name in enumerate(fx.variants)}
    runs = sorted(fx.study.runs, key=lambda r: (order.get(r.variant, len(order)), r.seed))
    listed: Counter[str] = Counter()
    reported = []
    for run in runs:
        if len(summaries.get(str(run.run_id), ())) and listed[run.variant] < REPORTED_SEEDS:
            listed[run.variant] += 1
            reported.append(run)
    return reported


def _uniform_sentence(fx: _Figures, runs: list[LoadedRun]) -> str:
    """Per Gaussian-encoding run of ``runs`` (the finding table's), the heads that became uniform, per layer with the
    epoch each did (or that none did), so a reader knows which centres the means leave out. Ends with a blank line
    when not empty."""
    parts = []
    listed = {run.run_id for run in runs}
    for run in fx.study.runs:
        if run.source != "tune" or not run.head_history or run.run_id not in listed:
            continue
        layers = [(i + 1, heads) for i, heads in enumerate(uniform_heads(run.head_history)) if heads]
        if not layers:
            parts.append(f"{fx.label(run.variant)} seed {run.seed}: none")
            continue
        parts.append(
            f"{fx.label(run.variant)} seed {run.seed}: "
            + "; ".join(
                f"layer {layer}: {len(heads)} head{'s' if len(heads) > 1 else ''} "
                f"({', '.join(str(h + 1) for h, _ in heads)}) became uniform, at epoch{'s' if len(heads) > 1 else ''} "
                f"{', '.join(str(e) for _, e in heads)}"
                for layer, heads in layers
            )
        )
    if not parts:
        return ""
    return (
        "Degenerate heads (uniform: largest eigenvalue of Sigma^-1 below 1e-5), left out of the means and counts "
        "above and drawn grey in Fig. 2 and the contour figures: " + ". ".join(parts) + ".\n\n"
    )


def add_finding_metrics(
    summary: dict[str, dict[str, Any]],
    study: LoadedStudy,
    summaries: Mapping[str, pd.DataFrame],
    baseline: str | None,
    gaps: Mapping[str, float],
) -> None:
    """Add the finding's numbers to the analyze stage's metrics entries (committed with the baseline: ``git diff``
    compares them across commits): ``gap_to_<baseline>_points`` per self-attention variant, and per
    Gaussian-encoding variant its first layer's ``layer1_displacement`` and ``layer1_heads_at_distinct_shifts``
    (means over seeds)."""
    for name, gap in gaps.items():
        if name in summary:
            summary[name][f"gap_to_{baseline}_points"] = round(gap, 4) if math.isfinite(gap) else None
    firsts: dict[str, list[pd.Series]] = {}
    for run in study.runs:
        frame = summaries.get(run.run_id)
        if frame is not None and len(frame) and run.variant in summary:
            firsts.setdefault(run.variant, []).append(frame.iloc[0])
    for name, rows in firsts.items():
        summary[name]["layer1_displacement"] = round(float(np.mean([r.displacement for r in rows])), 4)
        summary[name]["layer1_heads_at_distinct_shifts"] = float(np.mean([r.heads_at_distinct_shifts for r in rows]))


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

    def __init__(
        self,
        study: LoadedStudy,
        layout: Layout,
        outputs: Outputs,
        variants: list[Variant],
        test_images: int | None = None,
    ) -> None:
        self.study, self.layout, self.outputs, self.test_images = study, layout, outputs, test_images
        self.variants = {v.name: v for v in variants}

    def add(
        self,
        name: str,
        title: str,
        build: Callable[[], tuple[Figure, str] | str],
        into: list[FigureEntry] | None = None,
    ) -> None:
        """Build, save and list the figure (in the report's figure list, or in ``into``: a section's figures)."""
        made = build()
        if isinstance(made, str):
            self.outputs.skipped.append(f"{title}: {made}")
            log.info("figure %s skipped: %s", name, made)
            return
        fig, sentence = made
        path = figures.save(fig, self.layout.figures / f"{name}.png")
        self.outputs.files.setdefault("figures", []).append(path)
        (self.outputs.figures if into is None else into).append(FigureEntry(f"figures/{path.name}", title, sentence))
        log.info("figure %s written", path)

    def first(self, variant: str) -> LoadedRun | str:
        """The lowest-seed usable run of ``variant`` whose model loads, or why there is none."""
        usable = self.study.by_variant(variant)
        for run in usable:
            if run.model is not None:  # loaded on first use: a checkpoint that does not load makes the next seed's
                return run
        runs = self.study.by_variant(variant, usable=False)
        if not runs:
            return f"{variant} was not run"
        return f"{variant} has no completed run with a checkpoint ({runs[0].reason or runs[0].status})"

    def label(self, variant: str) -> str:
        return self.variants[variant].label if variant in self.variants else variant


def fig2_variant(variants: list[Variant]) -> str | None:
    """The variant whose head centres are the paper's Fig. 2: SA quadratic 9 heads, else the first variant with its
    encoding (``PAPER_VARIANT_FIELDS``) and position-only heads."""
    encoding = PAPER_VARIANT_FIELDS[FIG2_VARIANT]["encoding"]
    same = [v.name for v in variants if v.is_its_gaussian and v.config.get("encoding") == encoding]
    return FIG2_VARIANT if FIG2_VARIANT in same else next(iter(same), None)


def _trajectories(
    fx: _Figures, variant: str, summaries: Mapping[str, pd.DataFrame], gaps: Mapping[str, float]
) -> tuple[Figure, str] | str:
    run = fx.first(variant)
    if isinstance(run, str):
        return run
    summary = summaries.get(run.run_id)
    if not run.head_history or summary is None or summary.empty:
        return f"{variant} has no head history from its initialisation"
    layers = summary["layer"].tolist()
    notes = {int(row.layer): _layer_note(row) for _, row in summary.iterrows()}
    last = int(summary["epoch"].max())
    paper = "Fig. 2: h" if variant == fig2_variant(list(fx.variants.values())) else "H"
    title = f"{paper}ead centres of {fx.label(variant)} during training, every layer, seed {run.seed}"
    fig = figures.head_trajectories(run.head_history, layers, title=title, grid=run.model.grid, panel_notes=notes)
    first = summary.iloc[0]
    gap = f" Its accuracy gap to ResNet18: {_fmt_gap(gaps[variant])}." if variant in gaps else ""
    sentence = (
        f"Each head's attention centre from its random initialisation (circle) to epoch {last} (star), one panel per "
        f"layer, in token shifts from the query pixel (outlined square; the view spans at most the shifts of the "
        f"{run.model.grid[0]}x{run.model.grid[1]} token grid); each panel's title gives the layer's mean "
        f"displacement and its heads at distinct shifts. Layer 1: the heads moved {first.displacement:.2f} tokens "
        f"on average, their mean distance from the query went {first.centre_norm_init:.2f} -> "
        f"{first.centre_norm:.2f} and their attention distance {first.mean_attention_distance_init:.2f} -> "
        f"{first.mean_attention_distance:.2f}; its sharp heads put most of their mass on "
        f"{first.heads_at_distinct_shifts:.0f} distinct shifts near the query (at init: "
        f"{first.heads_at_distinct_shifts_init:.0f}; by position alone {first.shifts_by_position_init:.0f} -> "
        f"{first.shifts_by_position:.0f}), and {first.degenerate:.0f} of {first.heads:.0f} heads became uniform "
        f"(grey, left out of these numbers).{gap} The paper draws layer 4 after 300 epochs on CIFAR-10, its "
        "centres spread to distinct shifts around the query like the positions of a convolution kernel."
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
    rule = fx.study.prune_rule
    sentence = (
        f" The prune stage cut {len(pruned)} heads by {describe_rule(rule)}, per layer {per_layer} (grey dashed with x)"
    )
    if variant == "sa_generalized_9":
        paper = list(PAPER_PRUNED_HEADS)
        if is_papers_rule(rule):
            sentence += f"; the paper's rule cut {sum(paper)} of its 54 trained heads (per layer {paper})"
        else:
            sentence += f"; the paper cut {sum(paper)} of 54 by its own rule, a different experiment"
    return pruned, sentence + "."


def _contours(
    fx: _Figures, variant: str, summaries: Mapping[str, pd.DataFrame], gaps: Mapping[str, float]
) -> tuple[Figure, str] | str:
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
    fig = figures.head_contours(geometry, pruned=pruned, title=title, grid=run.model.grid)
    summary = summaries.get(run.run_id)
    measured = ""
    if summary is not None and len(summary):
        per_layer = ", ".join(f"{row.heads_at_distinct_shifts}" for row in summary.itertuples())
        first = summary.iloc[0]
        measured = (
            f" Layer 1 moved {first.displacement:.2f} tokens from its initialisation; distinct shifts near the "
            f"query that sharp heads occupy, per layer: {per_layer} (of {first.heads:.0f} heads)."
        )
    if variant in gaps:
        measured += f" Accuracy gap to ResNet18: {_fmt_gap(gaps[variant])}."
    sentence = (
        f"Each head's Gaussian attention around the query pixel (50% and 90% of its mass) in every layer after "
        f"training; mean attention distance per layer (the trial's, truncated at the grid's borders) "
        f"{', '.join(f'{d:.2f}' for d in distance)} tokens.{measured} "
        "In the paper the heads of the early layers attend to distinct nearby shifts (a grid like a convolution "
        "kernel) and the deeper layers attend further and wider." + pruning
    )
    return fig, sentence


def heads_table_of(run: LoadedRun) -> pd.DataFrame:
    """``heads_frame`` of one run, with the trial's last locality measurement when it has one. A run whose model was
    not loaded (``LoadedRun.same_as``) is measured from its histories on its architecture's loaded model: its last head
    snapshot holds its centres and ``Sigma^-1`` exactly, so its rows are those its own model would give, without
    fetching its checkpoint."""
    locality = run.locality_history[-1]["layers"] if run.locality_history else None
    twin = run.same_as
    if twin is not None and not run.model_loaded and locality is not None:
        snapshot = run.head_history[-1]["layers"] if run.head_history else None
        if snapshot is not None or twin.model.head_geometry() is None:  # no Gaussian heads: none needed
            return heads_frame(twin.model, locality, snapshot)
    return heads_frame(run.model, locality)


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
    threshold = (CONV_LIKE_MAX_DISTANCE, f"a 3x3 kernel's reach: {CONV_LIKE_MAX_DISTANCE} tokens")
    fig = figures.locality_curves(locality, variants, threshold=threshold, markers=markers)
    changes = []
    for variant in variants:
        by_epoch = locality[locality["variant"] == variant.name].groupby("epoch")["mean_distance"].mean()
        changes.append(f"{variant.label} {by_epoch.iloc[0]:.2f} -> {by_epoch.iloc[-1]:.2f}")
    sentence = (
        "Beyond the paper: each layer's mean attention distance (tokens; the mean over its heads), measured by the "
        "trial on each layer's own input at every epoch (epoch 0: before training) and logged to MLflow as "
        f"`locality/layer<l>/mean_distance` (from step 0); averaged over layers, first -> last epoch: "
        f"{'; '.join(changes)}. Truncated at the grid's borders, where keys end: these numbers depend on the grid "
        "(a uniform head reads 4.14 tokens on an 8x8 grid, 8.33 on 16x16) and compare epochs and layers of one run, "
        "not grids; the finding's section and the convolution-like table use each Gaussian head's own, "
        "grid-independent numbers. The dotted line is a 3x3 kernel's reach. The paper's Figs. 3/7 show the end "
        "state: early layers local, deeper layers wider."
    )
    return fig, sentence


def _theorem(fx: _Figures) -> tuple[Figure, str]:
    conv, x = theorem_case()
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
    gaussian = fx.variants[variant].is_its_gaussian
    if gaussian:  # the head's own peak (grid-independent; NaN, blank, for a uniform head)
        heads = heads.assign(peak_probability=heads["gaussian_peak"])
    title = f"Convolution-likeness of {fx.label(variant)}, seed {run.seed} (1 = attends to one shift)"
    fig = figures.convolution_likeness(heads, title=title)
    peak = heads["peak_probability"]
    measured = (
        "of its own Gaussian on an unbounded grid (blank: a uniform head)"
        if gaussian
        else "over interior queries of the trial's grid (no Gaussian: truncated at the grid's borders)"
    )
    rule = CONV_LIKE_RULE if gaussian else CONV_LIKE_RULE.split(", both from")[0] + ", from the same truncated measures"
    sentence = (
        f"Beyond the paper: each head's peak attention probability, {measured}, in {fx.label(variant)}; mean "
        f"{peak.mean():.2f}, {int((peak >= 0.5).sum())} of {len(heads)} heads at 0.5 or above, "
        f"{int(heads['conv_like'].sum())} convolution-like ({rule}). A head of Theorem 1's convolution "
        "attends with probability ~1 to one shift; the paper's trained quadratic heads are sharp in early layers."
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


def noise_note(table: pd.DataFrame, test_images: int | None) -> str:
    """What the test set's size allows: the intervals, and each pair of variants whose difference is smaller than
    the binomial noise (``analysis.noise``), so the table is not read as ranking them."""
    if not test_images:
        return "The test set's size was not known to the analysis: no intervals are given."
    rows = [r for r in table.to_dict("records") if r["n"] and math.isfinite(r["test_acc_mean"])]
    ties = [
        f"{a['model']} / {b['model']} ({100 * abs(a['test_acc_mean'] - b['test_acc_mean']):.2f} points, noise "
        f"±{100 * difference_noise(a['test_acc_mean'], b['test_acc_mean'], test_images):.2f})"
        for i, a in enumerate(rows)
        for b in rows[i + 1 :]
        if within_noise(a["test_acc_mean"], b["test_acc_mean"], test_images)
    ]
    text = (
        f"Test set: {test_images} images, so one image is {100 / test_images:.2f} points; in brackets each accuracy's "
        "binomial 95 % interval (Wilson; over the seeds' pooled answers), the test set's sampling noise alone."
    )
    if ties:
        text += " Differences smaller than that noise (95 %), which this test set cannot order: " + "; ".join(ties)
    return text + "."


def claims_markdown(rows: pd.DataFrame) -> str:
    """The claims table and a line on how its verdicts are reached (``analysis.verdicts``)."""
    intro = (
        "Each claim's verdict is computed by a stated rule from the numbers beside it (`analysis/verdicts.py`): "
        "**holds**, **does not hold**, or **cannot tell at this scale** when the 95 % interval straddles the rule's "
        "bound or the claim was not measured. With one seed the accuracies are paired on the test images (each "
        "answered by both final checkpoints); with several, across seeds. Compute: the runs' device-seconds, every "
        "attempt included (section Compute). Per row: `tables/claims.csv`."
    )
    return f"{intro}\n\n{rows.to_markdown(index=False, disable_numparse=True)}"


def write_outputs(
    study: LoadedStudy,
    setting: Mapping[str, Any],
    layout: Layout,
    test_images: int | None = None,
    images: torch.Tensor | None = None,
    image_labels: torch.Tensor | None = None,
) -> Outputs:
    """Write every output under ``layout``; returns what was written (for MLflow) and the tables. ``test_images``:
    the test set's size, for the accuracies' binomial intervals; ``images`` (normalised): what the representations
    are compared on (CKA); with their ``image_labels``, what the one-seed accuracy claims are paired on (per image);
    without them those say so."""
    variants = describe_variants(study.configs())
    runs = study.frame()
    table = accuracy_table(runs, variants, test_images=test_images)
    if not is_papers_rule(study.prune_rule):
        pruned = [v.name for v in variants if v.pruned_from is not None]
        table = mark_not_comparable(table, pruned, not_comparable_note(study.prune_rule))
    heads = heads_table(study)
    locality = study.locality()
    conv_like = conv_like_table(
        heads[["variant", "seed", "layer", "head", "conv_like"]] if len(heads) else heads, variants
    )
    outputs = Outputs(table=table, heads=heads, summary=metrics_summary(runs, variants), conv_like=conv_like)
    log.info("tables -> %s", layout.tables)
    for stale in layout.tables.glob("*") if layout.tables.is_dir() else []:
        if stale.is_file():  # a table this run does not write (no transform stage, say) must not survive an earlier run
            stale.unlink()
    outputs.files["tables"] = write_table(table, setting, layout.tables / "accuracy")
    motions = head_motions(study)
    summaries = {run_id: finding_summary(frame) for run_id, frame in motions.items()}
    baseline, gaps = accuracy_gaps(outputs.summary, variants)
    extra = {
        "runs.csv": as_integers(runs),
        "heads.csv": heads,
        "conv_like_heads.csv": as_integers(conv_like),
        "head_motion.csv": head_motion_table(study, motions),
    }
    for name, frame in extra.items():
        frame.to_csv(layout.tables / name, index=False)
        outputs.files["tables"].append(layout.tables / name)
    metrics = size_metrics(outputs.summary)
    add_finding_metrics(metrics, study, summaries, baseline, gaps)
    outputs.files["metrics"] = [write_metrics(metrics, layout.metrics)]

    offsets = epoch_offsets(study)
    curves = on_study_axis(study.curves(), offsets)
    locality = on_study_axis(locality, offsets)
    log.info("plot data -> %s", layout.plots)
    outputs.files["plots"] = _write_plots(layout, curves, locality, variants)

    log.info("figures -> %s", layout.figures)
    for stale in layout.figures.glob("*.png") if layout.figures.is_dir() else []:
        stale.unlink()  # a figure skipped this time must not survive from an earlier run
    fx = _Figures(study, layout, outputs, variants, test_images)
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
    finding_figures: list[FigureEntry] = []
    paper_fig2 = fig2_variant(variants)
    for variant in (v for v in variants if v.is_attention and v.pruned_from is None):
        if not variant.has_centres:
            continue
        is_fig2 = variant.name == paper_fig2
        fx.add(
            "fig2_trajectories" if is_fig2 else f"trajectories_{variant.name}",
            f"{'Fig. 2: head' if is_fig2 else 'Head'} centres of {variant.label} during training",
            lambda v=variant.name: _trajectories(fx, v, summaries, gaps),
            into=finding_figures,
        )
    if paper_fig2 is None:
        outputs.skipped.append("Fig. 2: head centres during training: no quadratic-encoding variant was run")
    for variant in (v for v in variants if v.is_attention):
        build = _contours if variant.has_centres else None
        figure = PAPER_FIGURE_NUMBERS.get(variant.name)
        prefix = f"{figure}: " if figure else ""
        if build is not None:
            fx.add(
                f"contours_{variant.name}",
                f"{prefix}{'head' if prefix else 'Head'} contours of {variant.label}",
                lambda v=variant.name: _contours(fx, v, summaries, gaps),
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
    if later := sum(r.metrics_only for r in study.runs):
        notes.append(
            f"{later} runs of later seeds (past each variant's {HISTORY_SEEDS} lowest completed seeds) count in the "
            "accuracy table, `tables/runs.csv` and the compute table; the head tables, the head motion, the locality "
            f"curves and the finding's means over seeds are those of the first {HISTORY_SEEDS} (`HISTORY_SEEDS` in "
            "`analysis/runs.py`)"
        )
    not_run = [f.label for name, f in PAPER_FIGURES.items() if name not in {v.name for v in variants}]
    if not study.prune_parent_run_id:
        notes.append("no prune manifest yet: the pruned models and Fig. 7's marks wait for the prune stage")
    table_md = to_markdown(table, setting).split("\n", 2)[2]  # without its setting line: the report's first line
    finding = _finding_section(fx, summaries, baseline, gaps)
    sections = [
        Section(finding.title, finding.body, finding_figures),
        _conv_like_section(conv_like),
    ]
    # Beyond the paper, each in its own module: Theorem 1 on the trained ResNet18, CKA against ResNet18, and the
    # attention kinds that read the content (ConViT's GPSA) beside the paper's quadratic model.
    transformed, transform_tables = write_transform(study, layout.tables, fx.add)
    labels = {v.name: v.label for v in variants}
    cka, cka_tables = write_cka(study, images, layout.tables, fx.add, labels)
    beyond, beyond_tables = write_beyond_paper(study, variants, paper_fig2, locality, layout.tables, fx.add)
    data_size, data_size_tables = write_data_size(study, locality, layout.tables, fx.add)
    sections += [*([transformed] if transformed else []), cka, *(s for s in (beyond, data_size) if s)]
    outputs.files["tables"] += [*transform_tables, *cka_tables, *beyond_tables, *data_size_tables]
    compute = study_compute(study)
    evidence = Evidence(study, variants, setting, images, image_labels, layout.tables)
    claim_rows = claims_table(claims(evidence, summaries, baseline, paper_fig2), compute, run_link(study))
    for name, frame in {"claims.csv": claim_rows, "compute.csv": as_integers(compute, ["seed"])}.items():
        frame.to_csv(layout.tables / name, index=False)
        outputs.files["tables"].append(layout.tables / name)
    if band := band_section_body(study, variants):
        sections.insert(0, Section("Seed band: accuracy across seeds, and the seeds a difference needs", band))
    sections.append(Section("Compute", compute_section_body(compute)))
    notes += evidence.notes
    quoted = quoted_table().to_markdown(index=False, disable_numparse=True)
    report = render_report(
        setting, table_md, outputs.figures, outputs.skipped, notes, sections, not_run, quoted,
        noise_note(table, test_images), claims_markdown(claim_rows),
    )  # fmt: skip
    write_text_atomic(layout.report, report)
    outputs.files["report"] = [layout.report]
    log.info("report -> %s", layout.report)
    return outputs
