"""The report's Theorem-1-on-ResNet18 section from hand-made runs: per-layer motion from the exact taps, the figure,
the table, and the stage's metrics summary."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from analysis.runs import LoadedRun, LoadedStudy
from analysis.transform_report import layer_motion, write_transform
from pipeline.finetune.manifest import FineTuneManifest
from pipeline.finetune.transform import TransformedModel
from pipeline.models.transformed_resnet import TransformedResNet18
from pipeline.trial.checkpoint import head_snapshot


def _run() -> LoadedRun:
    """A rebuilt width-4 ResNet18 whose first head of layer 1 moved by 0.5 tokens after one epoch."""
    model = TransformedResNet18(width=4)
    start = head_snapshot(model, 0)
    end = copy.deepcopy(start)
    end["epoch"] = 1
    end["layers"][0]["centres"][0][1] += 0.5
    run = LoadedRun("run-t", "t_resnet18", 0, "finished", "transform", model=model, image_shape=(3, 8, 8))
    run.head_history = [start, end]
    return run


def _entry(run: LoadedRun) -> TransformedModel:
    return TransformedModel(
        "t_resnet18", "resnet18", "run-r", "trial-r", 0, run.run_id, "t_resnet18 seed 0", "finished", 1,
        list(run.model.converted), 0.9, 0.9, 3e-6, 1e-14, 0.91, 100, 559, {"paper": 10, "full": 10},
        {"paper": 40, "full": 90}, "/c", "/d",
    )  # fmt: skip


def test_motion_is_measured_per_layer_on_its_own_grid() -> None:
    run = _run()
    motion = layer_motion(run, run.model.converted)
    assert list(motion["layer"]) == list(range(1, 18))
    assert list(motion["grid"][:2]) == ["10x10", "10x10"] and motion["grid"].iloc[-1] == "3x3"
    assert motion["max_displacement"].iloc[0] == pytest.approx(0.5)
    assert motion["displacement"].iloc[0] == pytest.approx(0.5 / 9)
    assert (motion["max_displacement"].iloc[1:] == 0).all()
    assert (motion["heads_at_distinct_shifts_init"] == 9).all()  # Lemma 1: every head on its own tap, sharp


def test_section_table_and_figure(tmp_path: Path) -> None:
    run = _run()
    entry = _entry(run)
    manifest = FineTuneManifest(
        "transform-x", "/ray", "tune-x", "sqlite:///x.db", "1", "p", {}, [entry], stage="transform"
    )
    study = LoadedStudy([], "sqlite:///x.db", "1", "p", None, transformed=[run], transform=manifest)
    drawn = []
    section, paths = write_transform(study, tmp_path, lambda name, title, build, into: drawn.append(build()[0]))
    assert section.title == "Theorem 1 on the trained ResNet18"
    cells = [" ".join(c.split()) for c in section.body.split("| t_resnet18 seed 0 |", 1)[1].split("\n")[0].split("|")]
    assert cells[:7] == ["90.00", "90.00", "91.00", "3.0e-06 / 1.0e-14", "100 -> 559", "10 -> 40", "10 -> 90"]
    assert "The heads moved by up to 0.5 tokens" in section.body
    assert paths == [tmp_path / "transform_motion.csv"] and len(drawn) == 1
    assert manifest.metrics_summary() == {"t_resnet18": {"test_acc_step0": 0.9, "test_acc": 0.91, "seeds": 1}}


def test_no_section_without_a_transform_manifest(tmp_path: Path) -> None:
    assert write_transform(LoadedStudy([], "u", "1", "p", None), tmp_path, print) == (None, [])
