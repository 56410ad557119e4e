"""The study with its Ray results in a bucket (``sweep.storage_path: s3://...``): a real S3-compatible server over
HTTP, the real tune and prune stages, Ray and MLflow server.

What must hold when nothing of the Ray results is on the driver's disk: trials checkpoint into the bucket, a failed
trial is retried from its checkpoint there, every location the runs and manifests record opens the bucket again,
pruning reads the trained checkpoint from the bucket and fine-tunes from pruned weights it put there, and an
interrupted sweep is restored from the bucket (same parent run, every epoch logged once).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from pipeline.sweep.storage import StoragePath

if TYPE_CHECKING:
    from conftest import Bucket, Project

pytestmark = pytest.mark.slow
EPOCHS = 2


@pytest.fixture(scope="module")
def s3_study(project: Project, new_bucket: Callable[[], Bucket]) -> dict:
    """``dvc repro prune`` with the storage in a fresh bucket: sa_generalized_9, failing once after epoch 1."""
    bucket = new_bucket()
    params = project.read_params()
    original = (project.path / "params.yaml").read_text()
    # A seed no other test trains: a trial of the same identity (model, train config, data, code) would be reused.
    params["sweep"].update(
        variants=["sa_generalized_9"], seeds=[21], fail_once_after_epoch=1, storage_path=bucket.uri("ray")
    )
    params["prune"] = {**params["prune"], "mode": "fraction", "fraction": 0.5, "epochs": EPOCHS, "variants": None}
    project.write_params(params)
    try:
        done = project.dvc("repro", "prune")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return {
            "bucket": bucket,
            "tune": json.loads((project.path / "results/tune/manifest.json").read_text()),
            "prune": json.loads((project.path / "results/prune/manifest.json").read_text()),
            "local_results": sorted(p.name for p in (project.path / "results/ray").glob("*-*")),
        }
    finally:
        (project.path / "params.yaml").write_text(original)


def test_trials_checkpoint_into_the_bucket_and_retry_from_it(s3_study: dict) -> None:
    bucket: Bucket = s3_study["bucket"]
    tune = s3_study["tune"]
    assert tune["ray_experiment_path"] == bucket.uri(f"ray/{tune['experiment_name']}")
    assert tune["experiment_name"] not in s3_study["local_results"]  # nothing of it on the driver's disk
    keys = bucket.keys(f"ray/{tune['experiment_name']}")
    experiment = f"ray/{tune['experiment_name']}"
    assert {f"{experiment}/mlflow_parent_run.json", f"{experiment}/sweep_plan.json"} <= set(keys)
    [trial] = tune["trials"]
    assert trial["status"] == "finished" and trial["epochs_completed"] == EPOCHS
    checkpoint = StoragePath(trial["checkpoint_dir"])
    assert checkpoint.remote and (checkpoint / "checkpoint.pt").is_file()
    assert StoragePath(trial["head_history"]).is_file()
    client = MlflowClient(tune["tracking_uri"])
    run = client.get_run(trial["run_id"])
    assert run.data.tags["tune.retries"] == "1"  # failed once after epoch 1, resumed from its checkpoint in the bucket
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "test_acc")) == [1, 2]
    assert run.data.tags["tune.checkpoint"] == trial["checkpoint_dir"]  # a location that opens the bucket again
    assert StoragePath(run.data.tags["ray.trial_path"]).subdirs("checkpoint_")
    uploaded = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")}
    assert "checkpoint/checkpoint.pt" in uploaded
    parent = client.get_run(tune["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["ray.experiment_path"] == tune["ray_experiment_path"]


def test_pruning_reads_and_writes_the_bucket(s3_study: dict) -> None:
    bucket: Bucket = s3_study["bucket"]
    prune = s3_study["prune"]
    [model] = prune["models"]
    assert model["status"] == "finished" and model["epochs_completed"] == EPOCHS
    pruned = StoragePath(model["pruned_checkpoint_dir"])
    assert pruned.remote and f"ray/{prune['experiment_name']}/pruned/" in pruned.fs_path
    assert (pruned / "checkpoint.pt").is_file()  # the fine-tuning trial started from these weights (init_from)
    assert StoragePath(model["checkpoint_dir"]).remote
    client = MlflowClient(prune["tracking_uri"])
    steps = sorted(m.step for m in client.get_metric_history(model["run_id"], "test_acc"))
    assert steps == list(range(EPOCHS + 1))
    assert any(key.startswith(f"ray/{prune['experiment_name']}/") for key in bucket.keys("ray"))


def test_an_interrupted_sweep_is_restored_from_the_bucket(
    project: Project, project_params: dict, bucket: Bucket
) -> None:
    """SIGINT once a trial has saved a checkpoint in the bucket: the re-run restores the Tune experiment from the
    bucket, continues the same parent and trial runs, and logs every epoch once."""
    project.dvc("repro", "prepare")  # this test may be the first of its worker's to need the prepared data
    project_params["train"]["epochs"] = 3
    project_params["sweep"].update(seeds=[22], fail_once_after_epoch=None, storage_path=bucket.uri("ray"))
    project.write_params(project_params)

    def saved() -> bool:
        return any("/checkpoint_000000/" in key for key in bucket.keys("ray"))

    code, output = project.interrupt_tune_when(saved, "checkpoint in the bucket", signal.SIGINT)
    assert code == 130, output[-3000:]
    [name] = {key.split("/")[1] for key in bucket.keys("ray") if key.startswith("ray/tune-")}
    parent = json.loads(StoragePath(bucket.uri(f"ray/{name}/mlflow_parent_run.json")).read_text())["parent_run_id"]
    again = project.run("python", "-m", "stages.tune")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"restoring the interrupted sweep at {bucket.uri(f'ray/{name}')}" in again.stdout + again.stderr
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    assert manifest["parent_run_id"] == parent
    client = MlflowClient(manifest["tracking_uri"])
    for trial in manifest["trials"]:
        assert trial["status"] == "finished"
        assert sorted(m.step for m in client.get_metric_history(trial["run_id"], "test_acc")) == [1, 2, 3]
