"""A checkpoint that does not load (truncated by a full disk or a killed copy) is never resumed from: the trial falls
back to the newest older checkpoint Tune kept, and every error names the file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from ray import tune

from pipeline.trial.checkpoint import CorruptCheckpointError, checkpoint_loads, load_checkpoint
from pipeline.trial.report import CHECKPOINT_FILE
from pipeline.trial.trainable import restorable_copy


def _trial_dir(root: Path, epochs: int) -> Path:
    """A trial directory as Tune lays it out: checkpoint_000000 .. checkpoint_<epochs-1>, one per epoch."""
    for index in range(epochs):
        directory = root / f"checkpoint_{index:06d}"
        directory.mkdir(parents=True)
        torch.save({"epoch": index + 1, "weights": torch.full((64,), float(index))}, directory / CHECKPOINT_FILE)
    return root


def _truncate(directory: Path) -> Path:
    path = directory / CHECKPOINT_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def test_a_truncated_checkpoint_names_its_file(tmp_path: Path) -> None:
    truncated = _truncate(_trial_dir(tmp_path, 1) / "checkpoint_000000")
    with pytest.raises(CorruptCheckpointError, match="corrupt checkpoint") as caught:
        load_checkpoint(truncated.parent)
    assert str(truncated) in str(caught.value)
    assert isinstance(caught.value, ValueError)  # an expected failure: the stages print one line, exit 2
    assert not checkpoint_loads(truncated.parent)


def test_resume_falls_back_to_the_newest_checkpoint_that_loads(tmp_path: Path, caplog) -> None:
    trial = _trial_dir(tmp_path / "trial", 3)
    truncated = _truncate(trial / "checkpoint_000002")
    latest = tune.Checkpoint.from_directory(str(trial / "checkpoint_000002"))
    with caplog.at_level(logging.WARNING, logger="pipeline.trial.trainable"):
        local = restorable_copy(latest, tmp_path / "copies")
    assert local is not None and local.name == "checkpoint_000001"
    assert load_checkpoint(local)["epoch"] == 2
    assert str(truncated) in caplog.text and "checkpoint_000001" in caplog.text


def test_resume_from_an_intact_latest_checkpoint_is_unchanged(tmp_path: Path, caplog) -> None:
    trial = _trial_dir(tmp_path / "trial", 2)
    with caplog.at_level(logging.WARNING, logger="pipeline.trial.trainable"):
        local = restorable_copy(tune.Checkpoint.from_directory(str(trial / "checkpoint_000001")), tmp_path / "copies")
    assert local is not None and load_checkpoint(local)["epoch"] == 2
    assert not caplog.text


def test_no_checkpoint_loads_so_the_trial_starts_over(tmp_path: Path) -> None:
    trial = _trial_dir(tmp_path / "trial", 2)
    for directory in trial.iterdir():
        _truncate(directory)
    assert restorable_copy(tune.Checkpoint.from_directory(str(trial / "checkpoint_000001")), tmp_path / "c") is None
