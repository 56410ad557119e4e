"""A trial's final model and dataset in MLflow, and the sweep's summary and registry, on a real sqlite store."""

from __future__ import annotations

from pathlib import Path

import mlflow.pytorch
import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.config import DataConfig, ModelConfig
from pipeline.models import build_model
from pipeline.sweep import summary, tracking
from pipeline.sweep.logged_model import MODEL_URI_TAG, PreparedDataset, log_trial_model, using_tracking_uri
from pipeline.sweep.manifest import ERROR, FINISHED, TrialRecord
from pipeline.trial.checkpoint import model_from_checkpoint, save_model_checkpoint

IMAGE_SHAPE = (3, 8, 8)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str]:
    folder = tmp_path_factory.mktemp("mlflow")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    return client, tracking.ensure_experiment(client, "logged-models", (folder / "artifacts").as_uri())


def _checkpoint(folder: Path, cfg: ModelConfig, seed: int) -> Path:
    torch.manual_seed(seed)
    model = build_model(cfg, image_size=IMAGE_SHAPE[1], in_channels=IMAGE_SHAPE[0], num_classes=10)
    save_model_checkpoint(folder, model, cfg, image_shape=IMAGE_SHAPE, num_classes=10)
    return folder


SA = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)
DATASET = PreparedDataset.of(DataConfig(dataset="digits", image_size=8), "ab" * 32, Path("/project"))


def test_the_logged_model_gives_the_checkpoints_logits(store, tmp_path: Path) -> None:
    client, experiment_id = store
    run_id = client.create_run(experiment_id).info.run_id
    checkpoint = _checkpoint(tmp_path / "ckpt", SA, seed=0)

    model_uri = log_trial_model(client.tracking_uri, run_id, checkpoint, DATASET)

    with using_tracking_uri(client.tracking_uri):  # where a user resolves ``models:/<id>``
        loaded = mlflow.pytorch.load_model(model_uri)
    images = torch.randn(5, *IMAGE_SHAPE)  # another batch size than the input example's
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model_from_checkpoint(checkpoint)(images), rtol=0, atol=0)
    logged = client.get_logged_model(model_uri.removeprefix("models:/"))
    assert logged.source_run_id == run_id
    (dataset,) = client.get_run(run_id).inputs.dataset_inputs
    assert dataset.dataset.name == "digits-8px" and dataset.dataset.digest == "ab" * 6
    assert {t.key: t.value for t in dataset.tags}["content_sha256"] == "ab" * 32


def _trial(client: MlflowClient, experiment_id: str, folder: Path, variant: str, seed: int, acc: float,
           status: str = FINISHED) -> TrialRecord:  # fmt: skip
    run = client.create_run(experiment_id, run_name=f"{variant}-seed{seed}")
    model_uri = log_trial_model(client.tracking_uri, run.info.run_id, _checkpoint(folder / variant / str(seed), SA,
                                                                                  seed), None)  # fmt: skip
    client.set_tag(run.info.run_id, MODEL_URI_TAG, model_uri)
    return TrialRecord(f"t-{variant}-{seed}", run.info.run_id, run.info.run_name, variant, seed, status, 2,
                       {"test_acc": acc}, None, None)  # fmt: skip


def test_the_parent_run_gets_summary_metrics_a_description_and_the_best_models(store, tmp_path: Path) -> None:
    client, experiment_id = store
    trials = [
        _trial(client, experiment_id, tmp_path, "sa_a", 0, 0.50),
        _trial(client, experiment_id, tmp_path, "sa_a", 1, 0.70),  # the best of sa_a
        _trial(client, experiment_id, tmp_path, "sa_a", 2, 0.90, status=ERROR),  # failed: never the best
        _trial(client, experiment_id, tmp_path, "sa_b", 0, 0.40),
    ]
    parent = client.create_run(experiment_id).info.run_id
    accuracy = {"sa_a": {"test_acc": 0.6, "test_acc_std": 0.1, "test_acc_n": 2},
                "sa_b": {"test_acc": 0.4, "test_acc_std": 0.0, "test_acc_n": 1}}  # fmt: skip
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


def test_flatten_keeps_mlflow_strings() -> None:
    tree = {"model": {"hidden": 32, "heads": [2, 4]}, "seed": 0, "path": None}
    assert tracking.flatten(tree) == {"model.hidden": "32", "model.heads": "[2, 4]", "seed": "0", "path": "None"}


def test_context_tags_name_the_dvc_experiment_only_under_dvc_exp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    plain = tracking.context_tags()
    assert tracking.DVC_EXP_TAG not in plain and plain["mlflow.user"]
    monkeypatch.setenv("DVC_EXP_NAME", "sunny-bass")
    assert tracking.context_tags()[tracking.DVC_EXP_TAG] == "sunny-bass"
