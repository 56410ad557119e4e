"""The report's "Does the self-attention model see like the CNN?": linear CKA of every self-attention variant's
layers, and of the rebuilt ResNet18's stages, against the trained ResNet18's stages, on the test set.

Raghu et al. (NeurIPS 2021) ask this of ViTs and ResNets; here the sweep trains both. Per variant, the run of the
lowest seed is compared with the ResNet18 of the same seed (else its lowest seed): rows are its layers' token
features (``layer 1`` ...) or, for a rebuilt ResNet18, its stem and stages; columns the ResNet18's stem and stages.
Matrices go to ``tables/cka_<variant>.csv``, heat-maps to ``figures/cka_<variant>.png``. At most ``CKA_IMAGES`` test
images: the Gram matrices are n x n.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import seaborn as sns
import torch
from matplotlib.figure import Figure

from analysis.cka import cka_matrix, layer_grams, representations
from analysis.report import Section
from analysis.runs import LoadedRun, LoadedStudy

log = logging.getLogger(__name__)

CKA_IMAGES = 500  # the first test images: the whole digits test set (360); at CIFAR-10 size, 500 x 500 Grams
AddFigure = Callable[..., None]  # analysis.study's figure writer: (name, title, build, into=...)


def _baseline_runs(study: LoadedStudy) -> list[LoadedRun]:
    """The trained ResNet18 runs (variant ``resnet18``, else any ``arch: resnet18`` variant), lowest seed first."""
    runs = study.by_variant("resnet18")
    if not runs:
        runs = sorted(
            (r for r in study.runs if r.config.get("arch") == "resnet18" and r.has_model and r.has_metrics),
            key=lambda r: r.seed,
        )
    return runs


def compared_runs(study: LoadedStudy) -> list[LoadedRun]:
    """Per variant with attention layers (self-attention, pruned or not, and rebuilt ResNet18s), its lowest-seed
    usable run, in the study's order."""
    seen: dict[str, LoadedRun] = {}
    for run in sorted([*study.runs, *study.transformed], key=lambda r: r.seed):
        if run.variant in seen or not run.has_model:
            continue
        is_attention = run.config.get("arch") in ("sa", "t_resnet18") or hasattr(run.structure, "layers")
        if is_attention and run.model is not None:  # loaded here, for the compared runs only
            seen[run.variant] = run
    order = [r.variant for r in [*study.runs, *study.transformed]]
    return sorted(seen.values(), key=lambda r: order.index(r.variant))


def cka_matrices(study: LoadedStudy, images: torch.Tensor) -> dict[str, pd.DataFrame]:
    """Per compared variant, its CKA matrix against the ResNet18 of the same seed (rows: its layers, columns: the
    ResNet18's stem and stages). Empty without a trained ResNet18."""
    baselines = _baseline_runs(study)
    if not baselines:
        return {}
    images = images[:CKA_IMAGES]
    grams: dict[str, tuple[list[str], list[torch.Tensor]]] = {}
    matrices = {}
    for run in compared_runs(study):
        baseline = next((b for b in baselines if b.seed == run.seed), baselines[0])
        if baseline.run_id not in grams:
            names, modules = representations(baseline.model)
            grams[baseline.run_id] = (names, layer_grams(baseline.model, modules, images))
        columns, column_grams = grams[baseline.run_id]
        rows, modules = representations(run.model)
        values = cka_matrix(layer_grams(run.model, modules, images), column_grams)
        matrices[run.variant] = pd.DataFrame(values, index=pd.Index(rows, name=run.variant), columns=columns)
        log.info("CKA %s seed %d vs %s seed %d", run.variant, run.seed, baseline.variant, baseline.seed)
    return matrices


def cka_figure(matrix: pd.DataFrame, title: str) -> Figure:
    """A heat-map of one CKA matrix, every cell annotated, on a fixed 0-1 colour scale so variants compare."""
    fig = Figure(figsize=(1.2 + 1.1 * matrix.shape[1], 0.9 + 0.45 * matrix.shape[0]))
    ax = fig.subplots()
    sns.heatmap(matrix, ax=ax, vmin=0.0, vmax=1.0, cmap="viridis", annot=True, fmt=".2f", cbar_kws={"label": "CKA"})
    ax.set_xlabel("ResNet18")
    ax.set_ylabel("")  # the title names the variant; its layers label the rows
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _best(matrix: pd.DataFrame) -> str:
    """Each row's most similar ResNet18 stage, in a few words."""
    return "; ".join(f"{row} ~ {matrix.loc[row].idxmax()} ({matrix.loc[row].max():.2f})" for row in matrix.index)


def write_cka(
    study: LoadedStudy, images: torch.Tensor | None, tables: Path, add_figure: AddFigure, labels: dict[str, str]
) -> tuple[Section, list[Path]]:
    """Compute, write and draw the CKA matrices; the report section and the table files written."""
    title = "Does the self-attention model see like the CNN? Linear CKA against ResNet18"
    if images is None:
        return Section(title, "No test images were given to compare representations on."), []
    matrices = cka_matrices(study, images)
    if not matrices:
        return Section(title, "No trained ResNet18 with a checkpoint to compare with."), []
    tables.mkdir(parents=True, exist_ok=True)
    paths, figures, lines = [], [], []
    for variant, matrix in matrices.items():
        path = tables / f"cka_{variant}.csv"
        matrix.to_csv(path)
        paths.append(path)
        label = labels.get(variant, variant)
        add_figure(
            f"cka_{variant}",
            f"Linear CKA: {label} against ResNet18",
            lambda m=matrix, t=label: (
                cka_figure(m, f"{t} vs ResNet18 (test set)"),
                "Each cell: linear CKA between the representations of the same test images; 1 = the same up to a "
                "rotation and a scale.",
            ),
            into=figures,
        )
        lines.append(f"- **{label}**: {_best(matrix)}")
    n = min(len(images), CKA_IMAGES)
    intro = (
        "Linear CKA (Kornblith et al. 2019; `analysis/cka.py`) between each layer's representation of the first "
        f"{n} test images and each ResNet18 stage's feature map (Raghu et al. 2021 ask this of ViTs): 1 = the same "
        "representation up to a rotation and an isotropic scale, near 0 = unrelated. Self-attention rows are a "
        "layer's token features (tokens x channels per image); a rebuilt ResNet18's rows are its own stem and "
        "stages after fine-tuning (equal to ResNet18's before it, so its diagonal starts at 1). Each variant's "
        "lowest seed against the ResNet18 of the same seed; matrices in `tables/cka_<variant>.csv`. Most similar "
        "ResNet18 stage per layer:"
    )
    return Section(title, "\n".join([intro, "", *lines]), figures), paths


__all__ = ["CKA_IMAGES", "cka_figure", "cka_matrices", "compared_runs", "write_cka"]
