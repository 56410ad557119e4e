"""The report's "Beyond the paper": attention kinds that read the content (ConViT's GPSA, ``model.content``) beside
the paper's position-only quadratic model.

d'Ascoli et al. (ConViT, ICML 2021) start each gated head as a convolution tap of this paper's quadratic encoding and
report that the heads of late layers escape locality (their gate ``sigma(lambda)`` falls, content takes over) while
early layers stay local. Here: per such variant, its final accuracy, each layer's non-locality (mean attention
distance on the layer's real input, tokens) first -> last epoch beside the reference's, and, for a kind that reports
a gate (its registry entry's ``head_reports``), the gate per head and layer after training. Which variants: every one
whose encoding reads the content or that sets ``content``; the reference is the paper's Fig. 2 model (SA quadratic,
9 heads). Tables: ``beyond_paper_locality.csv`` and ``beyond_paper_gates.csv``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis import figures
from analysis.report import Section
from analysis.runs import LoadedStudy
from analysis.variants import Variant
from pipeline.encodings import ENCODINGS

log = logging.getLogger(__name__)

AddFigure = Callable[..., None]  # analysis.study's figure writer: (name, title, build, into=...)
GATE = "gate"  # the per-head report whose figure this section draws (ConViT's sigma(lambda))
GATE_INIT = 1 / (1 + math.exp(-1.0))  # sigma(lambda) at ConViT's init, lambda = 1: 0.73
STAYED = 0.05  # a gate that moved less than this from GATE_INIT over the whole run "did not move"
LR = "train.lr"  # the run's logged param: GPSA trains at its own rate in the default study (params.yaml says why)


def content_variants(variants: Sequence[Variant]) -> list[Variant]:
    """The variants whose scores read the content: their encoding's entry says so, or they set ``content``."""
    chosen = []
    for variant in variants:
        encoding = variant.config.get("encoding")
        reads = encoding in ENCODINGS and ENCODINGS[encoding].reads_content
        content = str(variant.config.get("content")) in ("True", "true")  # as the checkpoint or MLflow has it
        if variant.is_attention and variant.pruned_from is None and (reads or content):
            chosen.append(variant)
    return chosen


def gates_frame(study: LoadedStudy, variant: str) -> pd.DataFrame:
    """The gate of every head after training, mean over the completed runs' seeds: layer, head (from 1), gate."""
    rows = [
        {"seed": run.seed, "layer": layer, "head": head, GATE: value}
        for run in study.by_variant(variant)
        if run.locality_history
        for layer, values in enumerate(run.locality_history[-1]["layers"], start=1)
        for head, value in enumerate(values.get(GATE, []), start=1)
    ]
    if not rows:
        return pd.DataFrame(columns=["layer", "head", GATE])
    return pd.DataFrame(rows).groupby(["layer", "head"], as_index=False)[GATE].mean()


def _final_accuracy(curves: pd.DataFrame, variant: str) -> float | None:
    runs = curves[curves["variant"] == variant].sort_values("epoch").groupby("seed").tail(1)
    return float(runs["test_acc"].mean()) if len(runs) else None


def _first_last(locality: pd.DataFrame, variant: str) -> pd.DataFrame:
    """Per layer, the non-locality at the first and last epoch (mean over seeds)."""
    rows = locality[locality["variant"] == variant]
    by_epoch = rows.groupby(["layer", "epoch"])["mean_distance"].mean().reset_index()
    ends = by_epoch.sort_values("epoch").groupby("layer")["mean_distance"]
    return pd.DataFrame({"first": ends.first(), "last": ends.last()}).reset_index()


def _trained_at(study: LoadedStudy, variant: str) -> str:
    """``, trained at lr 0.03``: the ``train.lr`` its completed runs logged (a variant may set its own); empty when
    none logged one."""
    rates = sorted({float(run.params[LR]) for run in study.by_variant(variant) if LR in run.params})
    return f", trained at lr {', '.join(f'{rate:g}' for rate in rates)}" if rates else ""


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def gate_sentence(gates: pd.DataFrame, label: str) -> str:
    per_layer = gates.groupby("layer")[GATE].mean()
    listing = ", ".join(f"{value:.2f}" for value in per_layer)
    first, last = per_layer.iloc[0], per_layer.iloc[-1]
    trend = (
        "lower in the last layer than in the first, the direction ConViT reports (late layers escape locality)"
        if last < first
        else "not lower in the last layer than in the first, unlike ConViT's finding that late layers escape locality"
    )
    content_heads = int((gates[GATE] < 0.5).sum())
    moved = float((gates[GATE] - GATE_INIT).abs().max())
    stayed = (
        f" No head's gate moved more than {moved:.2f} from its init: under the paper's SGD a gate moves by lr x its "
        "gradient, which is small here, where ConViT's AdamW steps every parameter by about its lr."
        if moved < STAYED
        else ""
    )
    return (
        f"Gate sigma(lambda) of {label} after training, mean per layer 1..{len(per_layer)}: {listing} (init "
        f"{GATE_INIT:.2f}, lambda = 1); {trend}. {content_heads} of {len(gates)} heads end below 0.5, i.e. more "
        f"content than position.{stayed}"
    )


def content_sentence(reference: pd.DataFrame, variant: pd.DataFrame, labels: tuple[str, str]) -> str:
    """What reading the content changed at the last epoch, layer by layer: the variant's non-locality minus the
    reference's (``_first_last`` frames of both)."""
    both = reference.merge(variant, on="layer", suffixes=("_ref", "_var"))
    if both.empty:
        return ""
    gaps = both["last_var"] - both["last_ref"]
    wider = [int(layer) for layer, gap in zip(both["layer"], gaps, strict=True) if gap > 0]
    listing = ", ".join(f"{gap:+.2f}" for gap in gaps)
    return (
        f"What reading the content changed: at the last epoch the attention of {labels[1]} is wider than that of "
        f"{labels[0]} in {len(wider)} of {len(both)} layers ({', '.join(map(str, wider)) or 'none'}); the difference "
        f"per layer 1..{len(both)}, in tokens: {listing}."
    )


def _gates_figure(gates: pd.DataFrame, label: str) -> tuple[Figure, str]:
    fig = figures.gate_heatmap(gates, title=f"Gate sigma(lambda) per head after training: {label}")
    sentence = (
        "Each head's gate after training (1: positional attention only, 0: content only), mean over seeds; ConViT's "
        "Fig. 5 shows early layers' gates staying high and late layers' falling."
    )
    return fig, sentence


def write_beyond_paper(
    study: LoadedStudy,
    variants: Sequence[Variant],
    reference: str | None,
    locality: pd.DataFrame,
    tables: Path,
    add_figure: AddFigure,
) -> tuple[Section | None, list[Path]]:
    """The section and its tables (None and none when no variant reads the content). ``locality``: the study's
    per-layer locality frame (variant, seed, epoch, layer, mean_distance, ...); ``reference``: the position-only
    variant to compare with (the paper's Fig. 2 model)."""
    chosen = content_variants(variants)
    if not chosen:
        return None, []
    curves = study.curves()
    by_name = {v.name: v for v in variants}
    compared = ([by_name[reference]] if reference in by_name else []) + chosen
    figures_: list = []
    sentences: list[str] = []
    locality_rows, gate_tables = [], []
    reference_accuracy = _final_accuracy(curves, reference) if reference in by_name else None
    reference_ends = _first_last(locality, reference) if reference in by_name else None
    content_sentences = []
    for variant in compared:
        ends = _first_last(locality, variant.name).assign(variant=variant.name)
        locality_rows.append(ends)
        if reference_ends is not None and variant.name != reference:
            labels = (by_name[reference].label, variant.label)
            content_sentences.append(content_sentence(reference_ends, ends, labels))
        moves = "; ".join(f"layer {int(r.layer)} {r.first:.2f} -> {r.last:.2f}" for r in ends.itertuples())
        final = _final_accuracy(curves, variant.name)
        gap = (
            f" ({100 * (final - reference_accuracy):+.1f} points from {by_name[reference].label})"
            if variant.name != reference and final is not None and reference_accuracy is not None
            else ""
        )
        sentences.append(
            f"- **{variant.label}** ({variant.name}){_trained_at(study, variant.name)}: final test accuracy "
            f"{_pct(final)}{gap}; non-locality (mean attention distance, tokens) first -> last epoch: "
            f"{moves or 'not measured'}."
        )
    body = [
        "ConViT (d'Ascoli et al. 2021) starts its gated positional self-attention (GPSA) from this paper's quadratic "
        "encoding, a grid of shifts of locality strength 1, and mixes it per head with content attention through a "
        "learned gate sigma(lambda). Measured on this study's setting (the report's first line), each beside the "
        "paper's position-only model; every number is from the trial's per-epoch measurement on each layer's real "
        "input (epoch 0: at init). Distances depend on the token grid, so compare layers and epochs, not settings. "
        "ConViT trains with AdamW; here every variant trains with the paper's SGD, at the learning rate stated (a "
        "variant's own `train.lr` where it sets one), so an accuracy gap says as much about that optimiser as about "
        "the attention.",
        "",
        *sentences,
        *(["", *filter(None, content_sentences)] if any(content_sentences) else []),
    ]
    frame = locality[locality["variant"].isin([v.name for v in compared])]
    if len(frame):
        add_figure(
            "beyond_nonlocality",
            "Non-locality per layer during training: GPSA beside SA quadratic",
            lambda: (
                figures.locality_curves(frame, compared, label="non-locality (mean attention distance, tokens)"),
                "Each layer's non-locality (ConViT's term: mean attention distance on the layer's input) per epoch, "
                "the reference and each content-reading variant side by side. ConViT reports its GPSA layers "
                "starting local and the late ones growing non-local during training.",
            ),
            into=figures_,
        )
    for variant in chosen:
        spec = ENCODINGS.get(str(variant.config.get("encoding")))
        if spec is None or GATE not in spec.head_reports:
            continue
        gates = gates_frame(study, variant.name)
        if gates.empty:
            continue
        gate_tables.append(gates.assign(variant=variant.name))
        body += ["", gate_sentence(gates, variant.label)]
        add_figure(
            f"beyond_gates_{variant.name}",
            f"Gates per head and layer after training: {variant.label}",
            lambda g=gates, label=variant.label: _gates_figure(g, label),
            into=figures_,
        )
    written = []
    if locality_rows:
        path = tables / "beyond_paper_locality.csv"
        pd.concat(locality_rows).to_csv(path, index=False)
        written.append(path)
    if gate_tables:
        path = tables / "beyond_paper_gates.csv"
        pd.concat(gate_tables).to_csv(path, index=False)
        written.append(path)
    log.info("beyond the paper: %s", [v.name for v in chosen])
    return Section("Beyond the paper", "\n".join(body), figures_), written


__all__ = ["content_variants", "gates_frame", "write_beyond_paper"]
