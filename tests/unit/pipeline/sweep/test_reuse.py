"""The reuse rule (reuse a finished run, resume an unfinished one from its newest checkpoint that loads, or train),
against a real MLflow store (sqlite in a temporary folder) with real checkpoint files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.sweep.checkpoints import newest_checkpoint
from pipeline.sweep.reuse import RESUME, REUSE, TRAIN, decide, decide_trials
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking import Store
from pipeline.sweep.tracking.store import CountingClient, find_runs
from pipeline.sweep.tracking.tags import TRIAL_PATH_TAG


@pytest.fixture
def store(tmp_path: Path) -> tuple[MlflowClient, str]:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client, client.create_experiment("reuse", artifact_location=(tmp_path / "artifacts").as_uri())


def checkpoint(directory: Path, epoch: int) -> Path:
    directory.mkdir(parents=True)
    torch.save({"epoch": epoch}, directory / "checkpoint.pt")
    return directory


def run(client: MlflowClient, experiment: str, key: str, status: str, **tags: str) -> str:
    created = client.create_run(experiment, tags={"trial_key": key, **tags})
    client.set_terminated(created.info.run_id, status=status)
    return created.info.run_id


def test_a_complete_run_is_reused(store: tuple[MlflowClient, str], tmp_path: Path) -> None:
    client, experiment = store
    done = checkpoint(tmp_path / "trial/checkpoint_000003", 4)
    run_id = run(
        client,
        experiment,
        "k",
        "FINISHED",
        **{"tune.status": "finished", "tune.last_epoch": "4", "tune.checkpoint": str(done)},
    )
    run(
        client,
        experiment,
        "other",
        "FINISHED",
        **{"tune.status": "finished", "tune.last_epoch": "4", "tune.checkpoint": str(done)},
    )
    plan = decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4)
    assert (plan.action, plan.run_id, plan.checkpoint_dir) == (REUSE, run_id, str(done))
    assert decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4, retrain=True).action == TRAIN


def test_locations_in_a_bucket_that_is_gone_are_missing_checkpoints(store: tuple[MlflowClient, str]) -> None:
    """An earlier run recorded its checkpoints in a bucket whose endpoint no longer answers: the plan does not fail,
    a finished run is still reused (its checkpoint is in MLflow) and an unfinished one trains anew."""
    client, experiment = store
    gone = "s3://b/ray/tune-x/trial_1?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    finished = run(
        client,
        experiment,
        "done",
        "FINISHED",
        **{"tune.status": "finished", "tune.last_epoch": "4", "tune.checkpoint": gone},
    )
    run(client, experiment, "half", "KILLED", **{TRIAL_PATH_TAG: gone, "tune.status": "interrupted"})
    found = find_runs(client, experiment, ["done", "half"])
    reused = decide("v", 0, "done", found["done"], epochs=4)
    assert (reused.action, reused.run_id, reused.checkpoint_dir) == (REUSE, finished, None)
    assert decide("v", 1, "half", found["half"], epochs=4).action == TRAIN


def test_an_unfinished_run_resumes_from_its_newest_checkpoint_that_loads(
    store: tuple[MlflowClient, str], tmp_path: Path
) -> None:
    client, experiment = store
    trial = tmp_path / "trial"
    checkpoint(trial / "checkpoint_000000", 1)
    good = checkpoint(trial / "checkpoint_000001", 2)
    truncated = trial / "checkpoint_000002"
    truncated.mkdir()
    (truncated / "checkpoint.pt").write_bytes((good / "checkpoint.pt").read_bytes()[:40])  # a crash mid-write
    run_id = run(client, experiment, "k", "KILLED", **{TRIAL_PATH_TAG: str(trial), "tune.status": "interrupted"})
    assert newest_checkpoint(StoragePath(trial)) == (StoragePath(good), 2)
    plan = decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4)
    assert (plan.action, plan.run_id, plan.checkpoint_dir, plan.epoch) == (RESUME, run_id, str(good), 2)
    assert plan.words() == f"resume run {run_id} from epoch 2"


def test_a_run_whose_files_are_gone_or_that_was_deleted_is_not_resumed(
    store: tuple[MlflowClient, str], tmp_path: Path
) -> None:
    client, experiment = store
    complete = run(
        client,
        experiment,
        "k",
        "FINISHED",
        **{"tune.status": "finished", "tune.last_epoch": "4", "tune.checkpoint": str(tmp_path / "deleted")},
    )
    plan = decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4)
    assert (plan.action, plan.run_id, plan.checkpoint_dir) == (REUSE, complete, None)  # MLflow holds its checkpoint
    run(client, experiment, "k1", "FAILED", **{TRIAL_PATH_TAG: str(tmp_path / "deleted-trial")})
    deleted = run(
        client,
        experiment,
        "k2",
        "FINISHED",
        **{"tune.status": "finished", "tune.last_epoch": "4", "tune.checkpoint": str(tmp_path)},
    )
    client.delete_run(deleted)
    runs = find_runs(client, experiment, ["k1", "k2"])
    assert decide("v", 0, "k1", runs["k1"], epochs=4).action == TRAIN
    assert runs["k2"] == [] and decide("v", 0, "k2", runs["k2"], epochs=4).action == TRAIN


def test_an_early_stopped_or_shorter_run_is_not_reused(store: tuple[MlflowClient, str], tmp_path: Path) -> None:
    client, experiment = store
    done = checkpoint(tmp_path / "trial/checkpoint_000001", 2)
    tags = {"tune.status": "early_stopped", "tune.last_epoch": "2", "tune.checkpoint": str(done)}
    run(client, experiment, "k", "FINISHED", **tags, **{TRIAL_PATH_TAG: str(done.parent)})
    plan = decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4)
    assert (plan.action, plan.epoch) == (RESUME, 2)  # ASHA may let it go on in the new sweep


def test_a_plan_costs_one_store_request_whatever_the_number_of_trials(store: tuple[MlflowClient, str]) -> None:
    """Planning 3 or 30 trials (every other one finished, among runs of other keys and runs without one) is one
    paged search: the requests do not grow with the trials."""
    client, experiment = store
    for i in range(10):
        run(client, experiment, f"unrelated{i}", "FINISHED")
        client.create_run(experiment)  # a parent run: no trial key

    def plan(trials: int) -> tuple[int, list[str]]:
        keys = [f"n{trials}-{i}" for i in range(trials)]
        for key in keys[::2]:
            run(client, experiment, key, "FINISHED", **{"tune.status": "finished", "tune.last_epoch": "4"})
            run(client, experiment, key, "KILLED")
        counting = CountingClient(client)
        seen: dict = {}
        decisions = decide_trials(
            "unused",
            experiment,
            [("v", i, k) for i, k in enumerate(keys)],
            4,
            store=Store("unused", counting),
            seen=seen,
        )
        assert len(seen) == 2 * len(keys[::2])  # two runs for every other key, none of the others
        return sum(counting.calls.values()), [d.action for d in decisions]

    small, large = plan(3), plan(30)
    assert small[0] == large[0] == 1
    assert large[1] == [TRAIN] * 30  # no checkpoint tag on the finished runs: nothing complete to reuse
