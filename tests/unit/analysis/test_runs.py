"""Fetching a study's runs from a real sqlite store: a local store's checkpoints are read where they lie, once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from analysis.runs import LoadedRun, fetch, local_artifacts
from pipeline.config import ModelConfig
from pipeline.models import build_model
from pipeline.sweep.tracking.store import ensure_experiment
from pipeline.trial.checkpoint import save_model_checkpoint


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///srv/mlartifacts/1/abc/artifacts", Path("/srv/mlartifacts/1/abc/artifacts")),
        ("/srv/mlartifacts/1/abc/artifacts", Path("/srv/mlartifacts/1/abc/artifacts")),
        ("mlflow-artifacts:/1/abc/artifacts", None),  # a server's proxied artifacts: downloaded
        ("s3://bucket/1/abc/artifacts", None),
    ],
)
def test_only_artifacts_on_this_machine_are_read_in_place(uri: str, expected: Path | None) -> None:
    assert local_artifacts(uri) == expected


def test_a_local_stores_checkpoint_is_read_in_place_and_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = ensure_experiment(client, "fetch", (tmp_path / "mlartifacts").as_uri())
    run_id = client.create_run(experiment_id).info.run_id
    cfg = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)
    checkpoint = tmp_path / "checkpoint"
    save_model_checkpoint(
        checkpoint,
        build_model(cfg, image_size=8, in_channels=3, num_classes=10),
        cfg,
        image_shape=(3, 8, 8),
        num_classes=10,
    )
    client.log_artifacts(run_id, str(checkpoint), artifact_path="checkpoint")
    client.log_metric(run_id, "test_acc", 0.5, step=1)
    client.set_terminated(run_id)
    reads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: reads.append(Path(path)) or load(path, *a, **k))
    cache = tmp_path / "cache"
    record = fetch(client, client.tracking_uri, LoadedRun(run_id, "sa", 0, "finished", "tune"), cache)
    assert record.reason is None and record.model is not None and record.test_acc == 0.5
    assert record.checkpoint_dir == tmp_path / "mlartifacts" / run_id / "artifacts" / "checkpoint"
    assert reads == [record.checkpoint_dir / "checkpoint.pt"]  # one read, of the store's own file
    assert not cache.exists() or not any(cache.iterdir())  # nothing copied
