"""A trial's final model and dataset in MLflow, on a real sqlite store."""

from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc
import mlflow.pytorch
import torch
from mlflow.entities import LoggedModelStatus

from pipeline.config import DataConfig, ModelConfig
from pipeline.models import build_model
from pipeline.sweep.tracking.logged_model import PreparedDataset, log_trial_model, using_tracking_uri
from pipeline.trial.checkpoint import model_from_checkpoint, save_model_checkpoint

IMAGE_SHAPE = (3, 8, 8)


def _checkpoint(folder: Path, cfg: ModelConfig, seed: int) -> Path:
    torch.manual_seed(seed)
    model = build_model(cfg, image_size=IMAGE_SHAPE[1], in_channels=IMAGE_SHAPE[0], num_classes=10)
    save_model_checkpoint(folder, model, cfg, image_shape=IMAGE_SHAPE, num_classes=10)
    return folder


SA = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)
DATASET = PreparedDataset.of(DataConfig(dataset="digits", image_size=8), "ab" * 32, Path("/project"))


def test_the_logged_model_gives_the_checkpoints_logits(store, tmp_path: Path) -> None:
    client, experiment_id = store
    run_id = client.create_run(experiment_id, tags={"variant": "sa_quadratic_9", "seed": "0"}).info.run_id
    client.log_param(run_id, "model.heads", "4")
    checkpoint = _checkpoint(tmp_path / "ckpt", SA, seed=0)

    model_uri = log_trial_model(client, client.tracking_uri, run_id, checkpoint, DATASET)

    images = torch.randn(5, *IMAGE_SHAPE)  # another batch size than the signature was inferred from
    with using_tracking_uri(client.tracking_uri):  # where a user resolves ``models:/<id>``
        loaded = mlflow.pytorch.load_model(model_uri)
        # As a server would run it: what log_model's serving check did with an input example (none is logged).
        served = mlflow.pyfunc.load_model(model_uri).predict(images.numpy())
    with torch.no_grad():
        expected = model_from_checkpoint(checkpoint)(images)
        torch.testing.assert_close(loaded(images), expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.as_tensor(served), expected, rtol=0, atol=0)
    logged = client.get_logged_model(model_uri.removeprefix("models:/"))
    assert logged.source_run_id == run_id and logged.experiment_id == experiment_id  # not the default experiment
    assert logged.name == "sa_quadratic_9-seed0" and logged.params == {"model.heads": "4"}
    assert logged.status.to_proto() == LoggedModelStatus.READY.to_proto()
    run = client.get_run(run_id)
    assert [m.model_id for m in run.outputs.model_outputs] == [logged.model_id]  # the run's Models column
    assert run.info.status == "RUNNING"  # its caller closes the run with the trial's own status
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.name == "digits-8px" and dataset.dataset.digest == "ab" * 6
    assert (
        dataset.dataset.source_type == "local" and dataset.dataset.source == '{"uri": "file:///project/data/prepared"}'
    )
    assert {t.key: t.value for t in dataset.tags} == {"content_sha256": "ab" * 32, "mlflow.data.context": "train"}
