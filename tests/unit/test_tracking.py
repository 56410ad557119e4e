"""How a trial ended, read back from its MLflow run (a real sqlite store), is the label its callback set."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline import tracking


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str]:
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    mlflow = MlflowClient(f"sqlite:///{store}")
    return mlflow, tracking.ensure_experiment(mlflow, "outcomes", Path(store.parent, "artifacts").as_uri())


@pytest.mark.parametrize(
    ("run_status", "label", "outcome"),
    [
        ("FINISHED", "finished", "finished"),
        ("FINISHED", "early_stopped", "early_stopped"),
        ("FAILED", "error", "error"),
        ("RUNNING", "running", "interrupted"),  # Tune never ended it: Ctrl-C, SIGTERM
        ("RUNNING", "finished", "interrupted"),  # tagged, but the driver died before closing it
        ("KILLED", "interrupted", "interrupted"),  # closed by close_interrupted
        ("FINISHED", None, "interrupted"),  # no label: not ended by the callback
    ],
)
def test_trial_outcome_is_the_callbacks_label(client, run_status: str, label: str | None, outcome: str) -> None:
    mlflow, experiment_id = client
    run = mlflow.create_run(experiment_id, tags={"tune.status": label} if label else {})
    if run_status != "RUNNING":
        mlflow.set_terminated(run.info.run_id, status=run_status)
    assert tracking.trial_outcome(mlflow.get_run(run.info.run_id)) == outcome


def test_a_trial_without_a_run_was_interrupted() -> None:
    assert tracking.trial_outcome(None) == tracking.INTERRUPTED
