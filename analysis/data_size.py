"""The report's data-size section: accuracy and layer-1 locality against ``train.data_fraction``, per encoding.

Raghu et al. (NeurIPS 2021) and ConViT (d'Ascoli et al. 2021) report that with less data the lower layers of attention
models learn fewer local heads, and that a convolutional start helps most there. A sweep whose variants differ in
``train.data_fraction`` (a grid axis, ``pipeline.data.subset``'s class-balanced subsets) measures it here: per run,
its final test accuracy and layer 1's mean attention distance at its last epoch (the trial's own measurement on the
fixed test batch), drawn against the fraction with one line per encoding (``encoding`` of the model; ``resnet18``
for the baseline, whose accuracy only is drawn). A sweep without that axis gets no section. Table: ``data_size.csv``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.report import Section
from analysis.runs import LoadedStudy
from pipeline.sweep.manifest import COMPLETED

log = logging.getLogger(__name__)

AddFigure = Callable[..., None]  # analysis.study's figure writer: (name, title, build, into=...)
FRACTION = "train.data_fraction"  # the run's logged param; a run logged before the field trained on all the data
COLUMNS = ["variant", "seed", "encoding", "data_fraction", "train_images", "test_acc", "layer1_distance"]


def encoding_of(config: dict) -> str:
    """The line a run belongs to: its encoding (``+content`` when it adds content scores), or its architecture."""
    if config.get("arch") != "sa":
        return str(config.get("arch", "?"))
    content = str(config.get("content")) in ("True", "true")
    return f"{config.get('encoding')}{'+content' if content else ''}"


def data_size_frame(study: LoadedStudy, locality: pd.DataFrame) -> pd.DataFrame:
    """One row per completed sweep run (not pruned or transformed models): ``COLUMNS``. ``locality``: the study's
    per-layer frame (variant, seed, epoch, layer, mean_distance)."""
    last = locality[locality["layer"] == 1].sort_values("epoch").groupby(["variant", "seed"])["mean_distance"].last()
    rows = [
        {
            "variant": run.variant,
            "seed": run.seed,
            "encoding": encoding_of(run.config),
            "data_fraction": float(run.params.get(FRACTION, 1.0)),
            "train_images": run.params.get("train_images"),
            "test_acc": run.test_acc,
            "layer1_distance": last.get((run.variant, run.seed), float("nan")),
        }
        for run in study.runs
        if run.source == "tune" and run.status in COMPLETED and run.has_metrics
    ]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"data_fraction": float, "layer1_distance": float})


def _sentence(encoding: str, rows: pd.DataFrame) -> str:
    means = rows.groupby("data_fraction")[["test_acc", "layer1_distance"]].mean()
    points = "; ".join(
        f"{fraction:g}: {100 * r.test_acc:.1f}%" + ("" if pd.isna(r.layer1_distance) else f", {r.layer1_distance:.2f}")
        for fraction, r in means.iterrows()
    )
    what = "accuracy" if means["layer1_distance"].isna().all() else "accuracy, layer-1 distance (tokens)"
    return f"- **{encoding}** (fraction: {what}, mean over seeds): {points}."


def write_data_size(
    study: LoadedStudy, locality: pd.DataFrame, tables: Path, add_figure: AddFigure
) -> tuple[Section | None, list[Path]]:
    """The section and its table; None and none when the sweep's runs all trained on one data fraction."""
    frame = data_size_frame(study, locality)
    if frame["data_fraction"].nunique() < 2:
        return None, []
    path = tables / "data_size.csv"
    frame.to_csv(path, index=False)
    body = [
        "Each model trained on a class-balanced fraction of the training set (`train.data_fraction`, the same fraction "
        "of every class, drawn from the trial's seed; the test set is whole). Raghu et al. (2021) and ConViT report "
        "fewer local heads in the lower layers with less data; here, per encoding, the final test accuracy and layer "
        "1's mean attention distance at the last epoch (smaller: more local), measured on this study's setting:",
        "",
        *(_sentence(encoding, rows) for encoding, rows in frame.groupby("encoding", sort=False)),
    ]
    figures_: list = []
    add_figure(
        "data_size",
        "Accuracy and layer-1 locality against the data fraction",
        lambda: (
            figures.data_size_curves(frame),
            "Final test accuracy (left) and layer 1's mean attention distance (right) against the fraction of the "
            "training set, one line per encoding; a line falling to the right on the right panel is the locality "
            "growing with data that Raghu et al. and ConViT describe.",
        ),
        into=figures_,
    )
    log.info("data size: fractions %s", sorted(frame["data_fraction"].unique()))
    return Section("Beyond the paper: data size", "\n".join(body), figures_), [path]


__all__ = ["data_size_frame", "encoding_of", "write_data_size"]
