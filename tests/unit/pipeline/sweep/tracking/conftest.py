"""What the tracking tests share: a real sqlite MLflow store (one per test module), with an experiment."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from pipeline.sweep.tracking.store import ensure_experiment


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str]:
    folder = tmp_path_factory.mktemp("mlflow")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    return client, ensure_experiment(client, "logged-models", (folder / "artifacts").as_uri())
