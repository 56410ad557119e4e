"""The tracked-run sequence the tune, prune and transform stages share, run directly on a real MLflow store: a sqlite
file, and a real ``mlflow server`` that goes down before the run ends (the writes still buffered are counted and,
with a bucket as storage, parked beside the experiment). The stage here reuses every trial, so no Ray starts; the
sequence with trials that train is the integration tests' (tune, prune, outage, reliability)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import Params, parse_params
from pipeline.sweep.manifest import TrialRecord
from pipeline.sweep.reuse import DECISIONS_FILE, REUSE, TrialDecision
from pipeline.sweep.storage import DRIVER_DIR, StoragePath, storage_dir
from pipeline.sweep.tracked import TrackedStage, run_tracked
from pipeline.sweep.tracking.buffer import BUFFER_FILE, TrackingBuffer
from pipeline.sweep.tracking.callback import TrialInfo
from pipeline.sweep.tracking.parent import ParentRun
from pipeline.sweep.tracking.store import artifact_root, ensure_experiment, tracking_uri


class ReusingStage(TrackedStage):
    """A stage whose every trial has a finished run already: the sequence decides, records and closes, trains nothing.
    ``on_wrap_up`` runs inside ``wrap_up`` (a test stops the server there)."""

    def __init__(
        self, params: Params, uri: str, runs: list[str], on_wrap_up: Callable[[], None] = lambda: None
    ) -> None:
        self.name, self.work, self.tracking_uri, self.experiment = "stage-x", "stage", uri, "tracked"
        self.tags, self.parent_tags = {"dvc_stage": "stage"}, {"stage.only": "parent"}
        self.parent_params, self.tuner_params = {"p": "1"}, params
        self.runs, self.on_wrap_up = runs, on_wrap_up
        self.wrapped: list[tuple[list[TrialDecision], list[TrialRecord]]] = []

    def decide(self, parent: ParentRun) -> list[TrialDecision]:
        return [
            TrialDecision("v", seed, f"key-{seed}", REUSE, run_id, None, 2) for seed, run_id in enumerate(self.runs)
        ]

    def trials(self, decisions: list[TrialDecision], path: StoragePath) -> tuple[list[dict], Callable]:
        return [], _no_run_info

    def wrap_up(
        self, parent: ParentRun, decisions: list[TrialDecision], records: list[TrialRecord], buffer: TrackingBuffer
    ) -> dict[str, str]:
        self.wrapped.append((decisions, records))
        self.on_wrap_up()
        buffer.set_tags(parent.parent_run_id, {"stage.wrapped": "yes"})
        return {"stage.trials": str(len(decisions))}


def _no_run_info(config: dict) -> TrialInfo:
    raise AssertionError("no trial runs in this stage")


def _params(storage: str, uri: str | None = None) -> Params:
    return parse_params({"sweep": {"storage_path": storage}, "tracking": {"uri": uri, "experiment": "tracked"}})


def _finished_runs(client: MlflowClient, n: int, project_root: Path) -> list[str]:
    """Runs of an earlier stage, in the experiment the stage creates (artifacts in the project, never ./mlruns)."""
    experiment_id = ensure_experiment(client, "tracked", artifact_root(client.tracking_uri, project_root))
    runs = [client.create_run(experiment_id).info.run_id for _ in range(n)]
    for run_id in runs:
        client.set_terminated(run_id, "FINISHED")
    return runs


def test_every_trial_reused_trains_nothing_and_closes_the_parent(tmp_path: Path) -> None:
    params = _params("results/ray")
    uri = tracking_uri(params.tracking, tmp_path)
    client = MlflowClient(uri)
    reused = _finished_runs(client, 2, tmp_path)
    stage = ReusingStage(params, uri, reused)

    outcome = run_tracked(stage, params, None, tmp_path)  # no trial trains: the data is never read

    assert (outcome.trained, outcome.records, outcome.buffered) == (0, [], 0)  # nothing went to Tune, nothing waits
    assert [d.run_id for d in outcome.decisions] == reused and len(stage.wrapped) == 1
    parent = client.get_run(outcome.parent.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.info.run_name == "stage-x"
    tags = parent.data.tags
    assert (tags["dvc_stage"], tags["stage.only"], tags["stage.wrapped"], tags["stage.trials"]) == (
        "stage",
        "parent",
        "yes",
        "2",
    )
    assert tags["sweep.role"] == "parent" and tags["ray.experiment_path"] == str(outcome.path)
    listed = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "sweep_trials.json", str(tmp_path))).read_text()
    )
    assert [(t["action"], t["run_id"]) for t in listed["trials"]] == [(REUSE, run_id) for run_id in reused]
    assert (outcome.path / DECISIONS_FILE).is_file()

    again = run_tracked(ReusingStage(params, uri, reused), params, None, tmp_path)
    assert again.parent.parent_run_id == outcome.parent.parent_run_id  # the parent recorded in the folder, continued


def test_a_failure_before_any_trial_leaves_no_parent_running(tmp_path: Path) -> None:
    params = _params("results/ray")
    uri = tracking_uri(params.tracking, tmp_path)
    stage = ReusingStage(params, uri, _finished_runs(MlflowClient(uri), 1, tmp_path))

    def refuse(decisions: list[TrialDecision], path: StoragePath) -> tuple[list[dict], Callable]:
        raise ValueError("a checkpoint that does not load")

    stage.trials = refuse  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="does not load"):
        run_tracked(stage, params, None, tmp_path)
    (parent,) = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("tracked").experiment_id], "attributes.run_name = 'stage-x'"
    )
    assert parent.info.status == "KILLED"


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["folder", "bucket"])
def test_writes_buffered_at_the_end_are_counted_and_a_buckets_parked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, storage: str
) -> None:
    """The server stops answering before the parent's end: the run still ends, its last writes wait in the buffer on
    the driver's disk, the outcome counts them (the stages exit 75), and with a bucket a copy lies beside the
    experiment for the next run on any machine. Nothing raises."""
    from tests.integration.conftest import MlflowServer

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    server = MlflowServer(tmp_path / "server")
    server.home.mkdir()
    server.start()
    try:
        where = request.getfixturevalue("bucket").uri("ray") if storage == "bucket" else "results/ray"
        params = _params(where, server.uri)
        stage = ReusingStage(
            params,
            server.uri,
            _finished_runs(MlflowClient(server.uri), 2, tmp_path / "project"),
            on_wrap_up=server.kill,
        )
        outcome = run_tracked(stage, params, None, tmp_path / "project")
    finally:
        server.stop()
    buffered = [json.loads(line)["op"] for line in Path(str(outcome.buffer_file)).read_text().splitlines()]
    # the stage's tag, the parent's closing tags, its end: in order, after sweep_trials.json went through
    assert buffered == ["log_batch", "log_batch", "set_terminated"] and outcome.buffered == 3
    experiment = storage_dir(params, tmp_path / "project") / "stage-x"
    assert (experiment / BUFFER_FILE).is_file()  # a folder holds the buffer itself, a bucket its parked copy
    on_driver = Path(str(outcome.buffer_file)).is_relative_to(tmp_path / "project" / DRIVER_DIR)
    assert on_driver is (storage == "bucket")
