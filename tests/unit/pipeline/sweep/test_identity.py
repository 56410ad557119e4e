"""A trial's identity: exactly what determines its result, stable across processes and places; and the reuse rule.

The reuse rule runs against a real MLflow store (sqlite in a temporary folder) with real checkpoint files.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.config import Params, parse_params
from pipeline.sweep import identity
from pipeline.sweep.identity import PROJECT_ROOT, TRIAL_CODE, code_hash, sweep_hash, trial_key
from pipeline.sweep.reuse import RESUME, REUSE, TRAIN, TRIAL_PATH_TAG, decide, find_runs, newest_checkpoint
from pipeline.sweep.storage import StoragePath

DATA = "a" * 64


def params(**sections: dict) -> Params:
    raw: dict = {"sweep": {"variants": ["sa_quadratic_9", "resnet18"], "seeds": [0, 1]}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return parse_params(raw)


BASE = trial_key(params(), "sa_quadratic_9", 0, DATA)


@pytest.mark.parametrize(
    ("what", "key"),
    [
        ("model width", lambda: trial_key(params(model={"hidden": 48}), "sa_quadratic_9", 0, DATA)),
        ("the variant", lambda: trial_key(params(), "resnet18", 0, DATA)),
        ("the seed", lambda: trial_key(params(), "sa_quadratic_9", 1, DATA)),
        ("train.lr", lambda: trial_key(params(train={"lr": 0.05}), "sa_quadratic_9", 0, DATA)),
        ("train.epochs", lambda: trial_key(params(train={"epochs": 8}), "sa_quadratic_9", 0, DATA)),
        ("the data", lambda: trial_key(params(), "sa_quadratic_9", 0, "b" * 64)),
    ],
)
def test_the_key_changes_with_each_input(what: str, key) -> None:
    assert key() != BASE, what


def test_the_key_changes_with_the_trial_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "code_hash", lambda root=PROJECT_ROOT: "edited-code")
    assert trial_key(params(), "sa_quadratic_9", 0, DATA) != BASE


@pytest.mark.parametrize(
    "elsewhere",
    [
        {"sweep": {"seeds": [0, 1, 2]}},  # the other trials of the sweep
        {"sweep": {"variants": ["sa_quadratic_9"]}},
        {"sweep": {"max_concurrent_trials": 7, "max_failures": 0, "retrain": True, "fail_once_after_epoch": 1}},
        {"sweep": {"ray_address": "127.0.0.1:6379", "storage_path": "/elsewhere/ray"}},  # where it runs
        {"sweep": {"asha": {"enabled": True}, "resources": {"cpu": 4, "gpu": 1}}},
        {"tracking": {"uri": "http://127.0.0.1:5000", "experiment": "other"}},
        {"data": {"prepared_dir": "/mnt/shared/prepared"}},
        {"prune": {"epochs": 3}},
    ],
)
def test_the_key_ignores_how_and_where_it_runs(elsewhere: dict) -> None:
    assert trial_key(params(**elsewhere), "sa_quadratic_9", 0, DATA) == BASE


def test_the_sweep_identity_ignores_where_things_live() -> None:
    base = sweep_hash(params(), DATA)
    moved = params(tracking={"uri": "http://127.0.0.1:5000"}, data={"prepared_dir": "/mnt/prepared"},
                   sweep={"storage_path": "/mnt/ray", "ray_address": "auto"})  # fmt: skip
    assert sweep_hash(moved, DATA) == base
    assert sweep_hash(params(sweep={"seeds": [0, 1, 2]}), DATA) != base


def test_the_key_is_stable_across_processes_and_key_order() -> None:
    """A fresh interpreter (another hash seed) computing it from reordered params gets the same key."""
    script = (
        "from pipeline.config import parse_params; from pipeline.sweep.identity import trial_key;"
        "raw = {'train': {}, 'sweep': {'seeds': [0, 1], 'variants': ['sa_quadratic_9', 'resnet18']}};"
        f"print(trial_key(parse_params(raw), 'sa_quadratic_9', 0, {DATA!r}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=PROJECT_ROOT)  # fmt: skip
    assert done.stdout.strip() == BASE


def test_the_code_hash_does_not_depend_on_where_the_project_is(tmp_path: Path) -> None:
    for entry in TRIAL_CODE:
        source = PROJECT_ROOT / entry
        if source.is_dir():
            shutil.copytree(source, tmp_path / entry, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tmp_path / entry)
    assert code_hash(tmp_path) == code_hash()


# --- the reuse rule, on a real MLflow store --------------------------------------------------------------------


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
    run_id = run(client, experiment, "k", "FINISHED", **{"tune.status": "finished", "tune.last_epoch": "4",
                                                         "tune.checkpoint": str(done)})  # fmt: skip
    run(client, experiment, "other", "FINISHED", **{"tune.status": "finished", "tune.last_epoch": "4",
                                                    "tune.checkpoint": str(done)})  # fmt: skip
    plan = decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4)
    assert (plan.action, plan.run_id, plan.checkpoint_dir) == (REUSE, run_id, str(done))
    assert decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4, retrain=True).action == TRAIN


def test_locations_in_a_bucket_that_is_gone_are_missing_checkpoints(store: tuple[MlflowClient, str]) -> None:
    """An earlier run recorded its checkpoints in a bucket whose endpoint no longer answers: the plan does not fail,
    a finished run is still reused (its checkpoint is in MLflow) and an unfinished one trains anew."""
    client, experiment = store
    gone = "s3://b/ray/tune-x/trial_1?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    finished = run(client, experiment, "done", "FINISHED", **{"tune.status": "finished", "tune.last_epoch": "4",
                                                               "tune.checkpoint": gone})  # fmt: skip
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
    assert plan.describe() == f"resume run {run_id} from epoch 2"


def test_a_run_whose_files_are_gone_or_that_was_deleted_is_not_resumed(
    store: tuple[MlflowClient, str], tmp_path: Path
) -> None:
    client, experiment = store
    complete = run(client, experiment, "k", "FINISHED", **{"tune.status": "finished", "tune.last_epoch": "4",
                                                           "tune.checkpoint": str(tmp_path / "deleted")})  # fmt: skip
    plan = decide("v", 0, "k", find_runs(client, experiment, ["k"])["k"], epochs=4)
    assert (plan.action, plan.run_id, plan.checkpoint_dir) == (REUSE, complete, None)  # MLflow holds its checkpoint
    run(client, experiment, "k1", "FAILED", **{TRIAL_PATH_TAG: str(tmp_path / "deleted-trial")})
    deleted = run(client, experiment, "k2", "FINISHED", **{"tune.status": "finished", "tune.last_epoch": "4",
                                                           "tune.checkpoint": str(tmp_path)})  # fmt: skip
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
