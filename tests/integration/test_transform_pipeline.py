"""The transform stage on the session's study (``study`` in conftest.py: its `dvc repro` rebuilds the trained ResNet18
as attention, checks it equal, fine-tunes it as a Tune trial and the analysis reports it); then the refusal of a
sweep whose ResNet18 did not finish, before any work."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def test_t_resnet18_equals_its_source_then_fine_tunes_in_one_run(study: dict) -> None:
    manifest = study["transform"]
    [model] = manifest["models"]
    assert (model["name"], model["source_variant"], model["seed"]) == ("t_resnet18", "resnet18", 31)
    assert model["status"] == "finished" and len(model["converted_layers"]) == 17
    assert model["test_acc_step0"] == model["source_test_acc"] == study["tune_metrics"]["resnet18"]["test_acc"]
    assert model["max_logit_diff_float64"] <= 1e-9
    metrics = study["transform_metrics"]["t_resnet18"]
    assert metrics["test_acc_step0"] == study["tune_metrics"]["resnet18"]["test_acc"]
    assert metrics["test_acc"] == model["test_acc"]
    client = MlflowClient(manifest["tracking_uri"])
    run = client.get_run(model["run_id"])
    assert run.data.tags["mlflow.parentRunId"] == manifest["parent_run_id"]
    assert run.data.tags["source_run_id"] == model["source_run_id"]
    step0 = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "test_acc")}
    assert step0[0] == model["test_acc_step0"] and len(step0) == model["epochs_completed"] + 1
    assert "locality/layer17/peak_probability" in run.data.metrics  # locality per epoch, like any attention model
    assert client.get_run(model["source_run_id"]).data.tags["transform.child_run_id"] == run.info.run_id


def test_the_report_has_both_sections_and_the_cka_matrices(study: dict) -> None:
    assert "## Theorem 1 on the trained ResNet18" in study["report"]
    assert "## Does the self-attention model see like the CNN? Linear CKA against ResNet18" in study["report"]
    assert "cka_t_resnet18.csv" in study["cka_tables"] and "cka_sa_generalized_9.csv" in study["cka_tables"]
    assert any(name.startswith("transform_heads_t_resnet18") for name in study["figures"])


def test_an_unfinished_resnet_is_refused_naming_the_variant(study: dict, project: Project) -> None:
    path = project.path / "results/tune/manifest.json"
    original = path.read_text()  # whichever sweep ran last (tests re-run stages): the study's is put in its place
    manifest = json.loads(json.dumps(study["tune"]))
    for trial in manifest["trials"]:
        if trial["variant"] == "resnet18":
            trial["status"] = "error"
    params = project.read_params()
    try:
        project.write_params(study["params"])
        path.write_text(json.dumps(manifest))
        done = project.attempt("python", "-m", "stages.transform", "--dry-run", timeout=120)
    finally:
        path.write_text(original)
        project.write_params(params)
    assert done.returncode == 2
    assert "transform.variants.t_resnet18: t_resnet18 seed 31 is built from a trained resnet18" in done.stderr
    assert "did not finish (status 'error')" in done.stderr
