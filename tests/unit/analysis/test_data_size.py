"""The report's data-size section from hand-made runs: a row per run, a line per encoding, none without the axis."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.data_size import data_size_frame, encoding_of, write_data_size
from analysis.figures import data_size_curves
from analysis.runs import LoadedRun, LoadedStudy

QUADRATIC = {"arch": "sa", "encoding": "quadratic", "heads": 2}


def _layer(distances: list[float]) -> dict[str, list[float]]:
    return {"mean_distance": distances, "entropy": [1.0, 1.0], "peak_probability": [0.5, 0.5]}  # only distances read


def _run(variant: str, seed: int, config: dict, fraction: float | None, acc: float, source: str = "tune") -> LoadedRun:
    """Layer 1's heads at distances ``1 + fraction`` and ``2 + fraction`` at the last epoch, 5 at epoch 0."""
    history = [
        {"epoch": e, "layers": [_layer([d, d + 1]), _layer([9.0, 9.0])]}
        for e, d in ((0, 5.0), (3, 1.0 + (fraction or 1.0)))
    ]
    params = {} if fraction is None else {"train.data_fraction": fraction, "train_images": int(100 * fraction)}
    return LoadedRun(
        f"run-{variant}-{seed}", variant, seed, "finished", source, params=params, test_acc=acc, model_config=config,
        locality_history=history if config["arch"] == "sa" else [],
    )  # fmt: skip


def _study(with_axis: bool = True) -> LoadedStudy:
    runs = [
        _run("size_data_fraction0.25", 0, QUADRATIC, 0.25, 0.40),
        _run("size_data_fraction0.25", 1, QUADRATIC, 0.25, 0.50),
        _run("sa_quadratic_9", 0, QUADRATIC, None, 0.80),  # logged before the field: all the data
        _run("gpsa_half", 0, {"arch": "sa", "encoding": "gpsa", "heads": 2}, 0.5, 0.60),
        _run("resnet18_quarter", 0, {"arch": "resnet18"}, 0.25, 0.70),
        _run("sa_quadratic_9_pruned", 0, QUADRATIC, 0.25, 0.10, source="prune"),  # not a row: a pruned model
    ]
    if not with_axis:
        runs = [r for r in runs if r.params.get("train.data_fraction", 1.0) == 1.0]
    return LoadedStudy(runs, "sqlite://", "1", "parent", None)


def test_one_row_per_sweep_run_with_its_fraction_accuracy_and_layer_one_distance() -> None:
    study = _study()
    frame = data_size_frame(study, study.locality())
    assert frame["variant"].tolist() == [
        "size_data_fraction0.25", "size_data_fraction0.25", "sa_quadratic_9", "gpsa_half", "resnet18_quarter",
    ]  # fmt: skip
    assert frame["data_fraction"].tolist() == [0.25, 0.25, 1.0, 0.5, 0.25]
    assert frame["encoding"].tolist() == ["quadratic", "quadratic", "quadratic", "gpsa", "resnet18"]
    # layer 1, last epoch, mean over its two heads: 1 + fraction + 0.5; no attention for ResNet18
    assert frame["layer1_distance"].tolist()[:4] == pytest.approx([1.75, 1.75, 2.5, 2.0])
    assert pd.isna(frame["layer1_distance"].iloc[4])
    assert encoding_of({"arch": "sa", "encoding": "learned", "content": True}) == "learned+content"


def test_the_section_draws_the_figure_and_writes_the_table(tmp_path: Path, recording_writer) -> None:
    study = _study()
    add, added = recording_writer

    section, tables = write_data_size(study, study.locality(), tmp_path, add)
    assert section is not None and added == ["data_size"]
    assert (
        "**quadratic** (fraction: accuracy, layer-1 distance (tokens), mean over seeds): "
        "0.25: 45.0%, 1.75; 1: 80.0%, 2.50." in section.body
    )
    assert "**resnet18** (fraction: accuracy, mean over seeds): 0.25: 70.0%." in section.body
    assert [p.name for p in tables] == ["data_size.csv"] and len(pd.read_csv(tables[0])) == 5


def test_no_section_when_every_run_trained_on_one_fraction(tmp_path: Path) -> None:
    study = _study(with_axis=False)
    assert write_data_size(study, study.locality(), tmp_path, None) == (None, [])


def test_the_figure_has_an_accuracy_and_a_locality_panel_with_a_line_per_encoding() -> None:
    study = _study()
    fig = data_size_curves(data_size_frame(study, study.locality()))
    accuracy, locality = fig.axes
    assert len(accuracy.get_legend().get_texts()) == 3 and len(locality.get_legend().get_texts()) == 2  # no ResNet
