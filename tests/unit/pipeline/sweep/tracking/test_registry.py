"""The parent run's summary and the model registry, on a real sqlite store."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow.pytorch
import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.config import ModelConfig
from pipeline.models import build_model
from pipeline.sweep.manifest import ERROR, FINISHED, TrialRecord
from pipeline.sweep.tracking import registry as summary
from pipeline.sweep.tracking.logged_model import log_checkpoint, using_tracking_uri
from pipeline.sweep.tracking.tags import MODEL_URI_TAG
from pipeline.trial.checkpoint import model_from_checkpoint, save_model_checkpoint

IMAGE_SHAPE = (3, 8, 8)
SA = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)


def _checkpoint(folder: Path, cfg: ModelConfig, seed: int) -> Path:
    torch.manual_seed(seed)
    model = build_model(cfg, image_size=IMAGE_SHAPE[1], in_channels=IMAGE_SHAPE[0], num_classes=10)
    save_model_checkpoint(folder, model, cfg, image_shape=IMAGE_SHAPE, num_classes=10)
    return folder


def _trial(
    client: MlflowClient,
    experiment_id: str,
    folder: Path,
    variant: str,
    seed: int,
    acc: float,
    status: str = FINISHED,
    tags: dict[str, str] | None = None,
) -> TrialRecord:
    """A trial's run as its end leaves it: its checkpoint uploaded and tagged (Ray's copy at ``folder``), no model."""
    run = client.create_run(experiment_id, run_name=f"{variant} seed {seed}", tags=tags or {})
    checkpoint = _checkpoint(folder / variant / str(seed), SA, seed)
    log_checkpoint(client, run.info.run_id, checkpoint, None, location=str(checkpoint))
    client.set_terminated(run.info.run_id)
    return TrialRecord(
        f"t-{variant}-{seed}",
        run.info.run_id,
        run.info.run_name,
        variant,
        seed,
        status,
        2,
        {"test_acc": acc},
        None,
        None,
    )


def test_the_parent_run_gets_summary_metrics_a_description_and_the_best_models(store, tmp_path: Path) -> None:
    client, experiment_id = store
    trials = [
        _trial(client, experiment_id, tmp_path, "sa_a", 0, 0.50),
        _trial(client, experiment_id, tmp_path, "sa_a", 1, 0.70),  # the best of sa_a
        _trial(client, experiment_id, tmp_path, "sa_a", 2, 0.90, status=ERROR),  # failed: never the best
        _trial(client, experiment_id, tmp_path, "sa_b", 0, 0.40),
    ]
    parent = client.create_run(experiment_id).info.run_id
    accuracy = {
        "sa_a": {"test_acc": 0.6, "test_acc_std": 0.1, "test_acc_n": 2},
        "sa_b": {"test_acc": 0.4, "test_acc_std": 0.0, "test_acc_n": 1},
    }
    sweep = summary.SweepSummary("Sweep of 2 variants x 2 seeds", "digits 8x8", 2, accuracy)

    summary.publish_summary(client.tracking_uri, parent, sweep, trials)
    summary.publish_summary(client.tracking_uri, parent, sweep, trials)  # a second call adds no version

    run = client.get_run(parent)
    assert run.data.metrics == {"test_acc.sa_a": 0.6, "test_acc.sa_b": 0.4}
    note = run.data.tags[summary.NOTE_TAG]
    assert note.startswith("**Sweep of 2 variants x 2 seeds**, 2 epochs each, on digits 8x8.")
    assert note.index("| sa_a | 0.6000") < note.index("| sa_b | 0.4000")  # best variant first
    assert "`logged-models.sa_a`" in note
    (version,) = client.search_model_versions("name = 'logged-models.sa_a'")
    assert version.run_id == trials[1].run_id
    assert version.source == client.get_run(trials[1].run_id).data.tags[MODEL_URI_TAG]
    assert len(client.search_model_versions("name = 'logged-models.sa_b'")) == 1
    # A model only for the registered runs, once each (the second call logged none): no trial's end logs one.
    # The store is shared with the module's other tests, which log models of their own runs: count this test's runs'.
    ours = {trial.run_id for trial in trials}
    models = [m for m in client.search_logged_models([experiment_id]) if m.source_run_id in ours]
    assert sorted(m.source_run_id for m in models) == sorted([trials[1].run_id, trials[3].run_id])
    assert MODEL_URI_TAG not in client.get_run(trials[0].run_id).data.tags


@pytest.mark.parametrize("ray_copy", ["kept", "deleted"])
def test_a_registered_model_is_logged_from_its_runs_checkpoint(store, tmp_path: Path, ray_copy: str) -> None:
    """The model registered gives the trial's checkpoint's logits: read from Ray's copy (``tune.checkpoint``) while it
    exists, else from the run's ``checkpoint/`` artifact."""
    client, experiment_id = store
    trial = _trial(client, experiment_id, tmp_path, "sa_e", 1, 0.5, tags={"variant": "sa_e", "seed": "1"})
    expected_model = model_from_checkpoint(tmp_path / "sa_e" / "1")
    if ray_copy == "deleted":
        shutil.rmtree(tmp_path / "sa_e")
    summary.register_best_models(client.tracking_uri, "logged-models", [trial])
    images = torch.randn(3, *IMAGE_SHAPE)
    with using_tracking_uri(client.tracking_uri), torch.no_grad():
        loaded = mlflow.pytorch.load_model("models:/logged-models.sa_e@best")
        torch.testing.assert_close(loaded(images), expected_model(images), rtol=0, atol=0)
    model = client.get_logged_model(client.get_run(trial.run_id).data.tags[MODEL_URI_TAG].removeprefix("models:/"))
    assert model.name == "sa_e-seed1" and model.source_run_id == trial.run_id


def test_a_run_without_a_checkpoint_is_not_registered_and_the_others_are(store, tmp_path: Path) -> None:
    client, experiment_id = store
    trial = _trial(client, experiment_id, tmp_path, "sa_f", 0, 0.5)
    bare = client.create_run(experiment_id).info.run_id  # ended before any checkpoint was uploaded
    lost = TrialRecord("t-lost", bare, "sa_g seed 0", "sa_g", 0, FINISHED, 2, {"test_acc": 0.9}, None, None)
    assert summary.register_best_models(client.tracking_uri, "logged-models", [trial, lost]) == {
        "sa_f": "logged-models.sa_f"
    }


def test_versions_carry_their_sweep_and_identity_and_best_follows_test_acc(store, tmp_path: Path) -> None:
    """Each sweep adds a version tagged with its sweep, params hash and trial key; alias ``best`` moves to a better
    version and stays when a later sweep is worse; the model is named after its variant and seed."""
    client, experiment_id = store
    sweeps = []
    for n, acc in enumerate((0.60, 0.80, 0.70)):
        sweep = client.create_run(experiment_id, run_name=f"tune sweep {n}").info.run_id
        tags = {"mlflow.parentRunId": sweep, "params_hash": f"hash{n}", "trial_key": f"key{n}"}
        tags |= {"variant": "sa_c", "seed": "3"}
        trial = _trial(client, experiment_id, tmp_path / str(n), "sa_c", 3, acc, tags=tags)
        summary.register_best_models(client.tracking_uri, "logged-models", [trial])
        sweeps.append((sweep, trial))
    name = "logged-models.sa_c"
    versions = {v.run_id: v for v in client.search_model_versions(f"name = '{name}'")}
    assert len(versions) == 3
    for n, (sweep, trial) in enumerate(sweeps):
        tags = versions[trial.run_id].tags
        assert tags["sweep_run_id"] == sweep and tags["params_hash"] == f"hash{n}" and tags["trial_key"] == f"key{n}"
        assert float(tags["test_acc"]) == trial.metrics["test_acc"]
    assert client.get_model_version_by_alias(name, "best").run_id == sweeps[1][1].run_id  # 0.80, not the latest
    description = client.get_registered_model(name).description
    assert "One version per sweep" in description and "`best`" in description and "pruned" not in description
    model = client.get_logged_model(client.get_run(sweeps[0][1].run_id).data.tags[MODEL_URI_TAG].split("/")[-1])
    assert model.name == "sa_c-seed3"


def test_the_pruned_models_description_says_pruned(store, tmp_path: Path) -> None:
    client, experiment_id = store
    trial = _trial(client, experiment_id, tmp_path, "sa_d", 0, 0.5)
    summary.register_best_models(client.tracking_uri, "logged-models", [trial], suffix="_pruned")
    description = client.get_registered_model("logged-models.sa_d_pruned").description
    assert "pruned (degenerate heads cut) and fine-tuned" in description
    assert client.get_model_version_by_alias("logged-models.sa_d_pruned", "best").run_id == trial.run_id
