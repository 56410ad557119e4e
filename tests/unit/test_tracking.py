"""How a trial ended, read back from its MLflow run (a real sqlite store), is the label its callback set."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.sweep import tracking
from pipeline.trial.report import WHERE_KEY


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


class _Trial:
    """The attributes of a Tune trial the callback reads."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id, self.config, self.checkpoint, self.num_failures = trial_id, {"variant": "x"}, None, 0
        self.path = f"/ray/experiment/{trial_id}"

    def __str__(self) -> str:
        return f"trial_{self.trial_id}"


def _describe(config: dict) -> tracking.TrialInfo:
    return tracking.TrialInfo(f"{config['variant']}-run", {"variant": config["variant"]}, {})


def _report(callback: tracking.MlflowTrialCallback, trial: _Trial, epoch: int) -> None:
    result = {key: 0.5 for key in tracking.EPOCH_METRICS} | {"epoch": epoch}
    callback.on_trial_result(iteration=epoch, trials=[trial], trial=trial, result=result)


def test_a_resumed_trial_does_not_log_an_epoch_twice(client) -> None:
    """Tune restores from its last snapshot, which can lag behind the last report (Ctrl-C in between): the epoch
    trained again after the restore is already in the run and must not be logged a second time."""
    mlflow, experiment_id = client
    parent = mlflow.create_run(experiment_id).info.run_id
    sweep = tracking.SweepRun(mlflow.tracking_uri, experiment_id, parent)
    trial = _Trial("t1")
    first = tracking.MlflowTrialCallback(sweep, _describe, {}, epochs=4)
    first.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (1, 2):
        _report(first, trial, epoch)
    snapshot = {"runs": dict(first.runs), "last_epoch": {"t1": 1}}  # Tune saved its state after epoch 1 only

    restored = tracking.MlflowTrialCallback(sweep, _describe, {}, epochs=4)
    restored.set_state(snapshot)
    restored.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (2, 3, 4):  # the trial resumes from epoch 1's checkpoint
        _report(restored, trial, epoch)
    restored.on_trial_complete(iteration=4, trials=[trial], trial=trial)

    run = mlflow.get_run(first.runs["t1"])
    steps = [m.step for m in mlflow.get_metric_history(run.info.run_id, "test_acc")]
    assert sorted(steps) == [1, 2, 3, 4]
    assert run.data.tags["tune.status"] == "finished" and run.info.status == "FINISHED"


def test_every_node_a_trial_ran_on_is_recorded_across_a_restore(client) -> None:
    """A retried trial can move to another node, a restored sweep continues the run: ``ray.node_ids`` lists every
    node in order, once each; ``ray.node_id`` is the last."""
    mlflow, experiment_id = client
    sweep = tracking.SweepRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    trial = _Trial("t2")

    def report(callback: tracking.MlflowTrialCallback, epoch: int, node: str) -> None:
        result = {key: 0.5 for key in tracking.EPOCH_METRICS} | {"epoch": epoch, WHERE_KEY: {"ray.node_id": node}}
        callback.on_trial_result(iteration=epoch, trials=[trial], trial=trial, result=result)

    first = tracking.MlflowTrialCallback(sweep, _describe, {}, epochs=4)
    first.on_trial_start(iteration=0, trials=[trial], trial=trial)
    report(first, 1, "node-a")
    report(first, 2, "node-b")  # retried on another node
    restored = tracking.MlflowTrialCallback(sweep, _describe, {}, epochs=4)
    restored.set_state({"runs": dict(first.runs), "last_epoch": {"t2": 2}})
    restored.on_trial_start(iteration=0, trials=[trial], trial=trial)
    report(restored, 3, "node-a")  # back on the first node after the restore
    report(restored, 4, "node-c")
    tags = mlflow.get_run(first.runs["t2"]).data.tags
    assert tags[tracking.NODES_TAG] == "node-a,node-b,node-c" and tags["ray.node_id"] == "node-c"
