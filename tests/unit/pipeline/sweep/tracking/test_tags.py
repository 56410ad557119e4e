"""What a run holds: params flattened as MLflow's strings, the context tags."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.config import load_params
from pipeline.sweep.tracking.tags import DVC_EXP_TAG, context_tags, flatten, parent_run_name

PARAMS = Path(__file__).resolve().parents[5] / "params.yaml"


def test_flatten_keeps_mlflow_strings() -> None:
    tree = {"model": {"hidden": 32, "heads": [2, 4]}, "seed": 0, "path": None}
    assert flatten(tree) == {"model.hidden": "32", "model.heads": "[2, 4]", "seed": "0", "path": "None"}


def test_context_tags_name_the_dvc_experiment_only_under_dvc_exp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    plain = context_tags()
    assert DVC_EXP_TAG not in plain and plain["mlflow.user"]
    monkeypatch.setenv("DVC_EXP_NAME", "sunny-bass")
    assert context_tags()[DVC_EXP_TAG] == "sunny-bass"


def test_a_parent_run_is_named_after_its_dvc_experiment_or_its_changed_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tune sunny-bass`` under ``dvc exp run``; otherwise the params that differ from the committed params.yaml;
    the fallback outside git."""
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    params = load_params(PARAMS)
    assert parent_run_name("tune", params, tmp_path, "tune-abc") == "tune-abc"  # no git: nothing to compare with
    shutil.copy(PARAMS, tmp_path / "params.yaml")
    for args in (
        ["init", "-q"],
        ["add", "params.yaml"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p"],
    ):
        subprocess.run(["git", *args], cwd=tmp_path, check=True)
    assert parent_run_name("tune", params, tmp_path, "tune-abc") == "tune committed params"
    changed = params.model_copy(update={"train": params.train.model_copy(update={"epochs": 3})})
    assert parent_run_name("tune", changed, tmp_path, "tune-abc") == "tune train.epochs=3"
    monkeypatch.setenv("DVC_EXP_NAME", "sunny-bass")
    assert parent_run_name("prune", changed, tmp_path, "prune-abc") == "prune sunny-bass"
