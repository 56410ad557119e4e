"""What a run holds: params flattened as MLflow's strings, the context tags."""

from __future__ import annotations

import pytest

from pipeline.sweep.tracking.tags import DVC_EXP_TAG, context_tags, flatten


def test_flatten_keeps_mlflow_strings() -> None:
    tree = {"model": {"hidden": 32, "heads": [2, 4]}, "seed": 0, "path": None}
    assert flatten(tree) == {"model.hidden": "32", "model.heads": "[2, 4]", "seed": "0", "path": "None"}


def test_context_tags_name_the_dvc_experiment_only_under_dvc_exp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    plain = context_tags()
    assert DVC_EXP_TAG not in plain and plain["mlflow.user"]
    monkeypatch.setenv("DVC_EXP_NAME", "sunny-bass")
    assert context_tags()[DVC_EXP_TAG] == "sunny-bass"
