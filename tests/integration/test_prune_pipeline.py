"""The prune stage on the session's study (``study`` in conftest.py: its `dvc repro` trains the generalized-quadratic
model, cuts half the heads of every layer (fraction mode), evaluates the pruned model and fine-tunes it as a Tune
trial); then a grown sweep, and the refusals that must come before Ray starts.
"""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import STUDY_PRUNE_EPOCHS as EPOCHS

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def test_prune_manifest_names_finished_fine_tuning_runs(study: dict) -> None:
    manifest = study["prune"]
    client = MlflowClient(manifest["tracking_uri"])
    parent = client.get_run(manifest["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.info.run_name.startswith("prune ")
    assert parent.info.run_name.startswith("prune grid.sa.arch=sa, ")  # what differs from the committed params
    assert parent.data.params["prune.fraction"] == "0.5"
    assert (
        manifest["experiment_name"].startswith("prune-") and manifest["experiment_id"] == study["tune"]["experiment_id"]
    )
    [model] = manifest["models"]
    run = client.get_run(model["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == manifest["parent_run_id"]
    assert run.data.tags["source_run_id"] == model["source_run_id"]
    source = client.get_run(model["source_run_id"])
    note = run.data.tags["mlflow.note.content"]  # the run's description links its source run
    assert f"[{source.info.run_name}](#/experiments/{manifest['experiment_id']}/runs/{source.info.run_id})" in note
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == [d.dataset.name for d in source.inputs.dataset_inputs]
    assert run.inputs.dataset_inputs  # the data it was fine-tuned on, as the sweep's runs record theirs
    assert source.data.tags["prune.child_run_id"] == model["run_id"]
    steps = [m.step for m in client.get_metric_history(model["run_id"], "test_acc")]
    assert sorted(steps) == list(range(EPOCHS + 1))  # step 0: right after pruning, then each fine-tuning epoch
    step0 = next(m.value for m in client.get_metric_history(model["run_id"], "test_acc") if m.step == 0)
    assert step0 == pytest.approx(model["acc_after_pruning"])
    assert run.data.params["train.epochs"] == str(EPOCHS)
    assert float(run.data.params["train.lr"]) == pytest.approx(0.1 * study["params"]["train"]["lr"])
    assert run.data.params["prune.pruned_heads.layer1"] == str(model["pruned_heads"][0])
    assert "pruning_decisions.json" in [a.path for a in client.list_artifacts(model["run_id"])]
    versions = client.search_model_versions("name = 'it-sweep.sa_generalized_9_pruned'")
    assert model["run_id"] in {version.run_id for version in versions}  # the fine-tuned model, registered
    runs = client.search_runs([manifest["experiment_id"]], f"tags.params_hash = '{manifest['experiment_name'][6:]}'")
    assert len(runs) == 2  # the parent and one child: nothing duplicated


def test_pruned_model_is_smaller_and_recorded_with_its_decisions(study: dict) -> None:
    [model] = study["prune"]["models"]
    heads = study["params"]["variants"]["sa_generalized_9"]["heads"]
    assert model["pruned_heads"] == [heads // 2] * study["params"]["model"]["layers"]
    assert model["heads_per_layer"] == [heads - heads // 2] * study["params"]["model"]["layers"]
    assert model["params_after"] < model["params_before"]
    assert model["flops_after"]["paper"] < model["flops_before"]["paper"]
    assert model["status"] == "finished" and model["epochs_completed"] == EPOCHS
    for key in ("acc_before_pruning", "acc_after_pruning", "acc_after_finetune"):
        assert 0.0 <= model[key] <= 1.0
    cut = [d for layer in model["decisions"] for d in layer if d["pruned"]]
    assert len(cut) == sum(model["pruned_heads"]) and all("most degenerate" in d["reason"] for d in cut)
    # What only this stage measures (before pruning is the tune stage's test_acc, sizes the analyze stage's):
    assert set(study["prune_metrics"]["sa_generalized_9_pruned"]) == {"acc_after_pruning", "test_acc", "seeds"}
    dry_run = study["prune_dry_run"]
    assert "heads cut per layer" in dry_run and f"{model['params_after']:,}" in dry_run
    assert f"fine-tuning: reuse run {model['run_id']}" in dry_run  # run after the stage: nothing to train


def test_a_grown_sweep_prunes_and_fine_tunes_only_its_new_model(study: dict, project: Project) -> None:
    """The generalized model alone, with a second seed: seed 31's fine-tuning run (the study's) is reused; its source
    checkpoint's Ray copy is moved away meanwhile, so the prune stage plans from the copy it downloads through MLflow
    (put back afterwards, for the other tests)."""
    params = json.loads(json.dumps(study["params"]))
    params["sweep"].update(variants=["sa_generalized_9"], seeds=[31, 32])
    original = (project.path / "params.yaml").read_text()
    [source] = [t for t in study["tune"]["trials"] if t["variant"] == "sa_generalized_9"]
    ray_copy = project.path / source["checkpoint_dir"]
    ray_copy.rename(ray_copy.with_name("moved-away"))
    project.write_params(params)
    try:
        done = project.dvc("repro", "prune")
        manifest = json.loads((project.path / "results/prune/manifest.json").read_text())
    finally:
        (project.path / "params.yaml").write_text(original)
        ray_copy.with_name("moved-away").rename(ray_copy)
    assert "downloading its checkpoint from MLflow" in done.stderr + done.stdout
    by_seed = {m["seed"]: m for m in manifest["models"]}
    [before] = study["prune"]["models"]
    assert by_seed[31]["reused"] and by_seed[31]["run_id"] == before["run_id"]  # its fine-tuning run, reused
    assert by_seed[31]["acc_after_pruning"] == pytest.approx(before["acc_after_pruning"])
    assert by_seed[31]["acc_after_finetune"] == pytest.approx(before["acc_after_finetune"])
    assert not by_seed[32]["reused"] and by_seed[32]["status"] == "finished"
    client = MlflowClient(manifest["tracking_uri"])
    for model in manifest["models"]:  # one fine-tuning run per pruned model's identity
        assert len(client.search_runs([manifest["experiment_id"]], f"tags.trial_key = '{model['prune_key']}'")) == 1
    assert client.get_run(manifest["parent_run_id"]).data.tags["prune.models_reused"] == "1"


def _refused(project: Project, params: dict) -> subprocess.CompletedProcess:
    original = (project.path / "params.yaml").read_text()
    project.write_params(params)
    try:
        return project.attempt("python", "-m", "stages.prune", timeout=120)
    finally:
        (project.path / "params.yaml").write_text(original)


def test_a_stale_tune_manifest_is_refused_before_ray(study: dict, project: Project) -> None:
    params = json.loads(json.dumps(study["params"]))
    params["train"]["lr"] = 0.05  # the manifest's sweep was trained at another lr
    done = _refused(project, params)
    assert done.returncode == 2 and "stale tune manifest" in done.stderr
    assert "ray" not in done.stderr.lower().split("stale")[0]  # refused before Ray started


def test_pruning_the_learned_encoding_is_refused(project: Project) -> None:
    params = project.read_params()
    params["sweep"]["variants"] = ["sa_generalized_9", "sa_learned_9"]
    params["prune"]["variants"] = ["sa_learned_9"]
    done = _refused(project, params)
    assert done.returncode == 2 and "cannot prune 'sa_learned_9'" in done.stderr
