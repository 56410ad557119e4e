"""A queued experiment (``dvc exp run --queue`` + ``dvc queue start``) runs in a temporary workspace under
``.dvc/tmp/exps/`` that DVC deletes afterwards: its MLflow runs and Ray checkpoints must land in the project's real
stores, and its committed manifest must name them."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow.artifacts
import pytest
from mlflow.tracking import MlflowClient

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def _wait_for_queue(project: Project, timeout_s: float = 540) -> str:
    """Poll ``dvc queue status`` until no task is queued or running; its last table."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = project.dvc("queue", "status").stdout
        rows = [line.split() for line in status.splitlines()[1:] if line.strip()]
        tasks = [row for row in rows if row and row[-1] in ("Queued", "Running", "Success", "Failed")]
        if tasks and not [row for row in tasks if row[-1] in ("Queued", "Running")]:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"the queued experiment did not end within {timeout_s:g} s:\n{status}")
        time.sleep(5)


@pytest.fixture(scope="module")
def queued(project: Project, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A clone of the test project on the default store (``<project>/mlflow.db``) and one trial, after ``dvc exp run
    --queue tune -S train.epochs=1`` and ``dvc queue start`` ran to the end."""
    path = tmp_path_factory.mktemp("queued") / "proj"
    project.run("git", "clone", "-q", str(project.path), str(path))
    queued = type(project)(path, project.env)
    params = queued.read_params()  # the tiny profile, as committed
    # No injected failure: a retry starts another Ray worker, which this test has no use for.
    params["sweep"].update(variants=["resnet18"], max_concurrent_trials=1, fail_once_after_epoch=None)
    params["tracking"] = {"uri": None, "experiment": "it-queued"}  # the default store: <project>/mlflow.db
    queued.write_params(params)
    queued.run("git", "commit", "-q", "-am", "default store, one trial")

    queued.dvc("exp", "run", "--queue", "tune", "-S", "train.epochs=1", "-n", "one-epoch")
    queued.dvc("queue", "start")
    status = _wait_for_queue(queued)
    assert "Success" in status, status + queued.run("dvc", "queue", "logs", "one-epoch").stdout[-3000:]
    subprocess.run(["dvc", "queue", "stop"], cwd=path, env=project.env, capture_output=True, timeout=60)
    return {"project": queued, "path": path}


def test_a_queued_experiment_keeps_its_runs_in_the_project(queued: dict) -> None:
    queued, path = queued["project"], queued["path"]
    ref = next(
        line.split()[1]
        for line in queued.run("git", "show-ref").stdout.splitlines()
        if line.split()[1].startswith("refs/exps/") and line.endswith("/one-epoch")
    )
    text = queued.run("git", "show", f"{ref}:results/tune/manifest.json").stdout
    assert str(path) not in text and not [w for w in (".dvc/tmp", "/tmp/") if w in text]  # no machine path in it
    manifest = json.loads(text)
    assert manifest["tracking_uri"] == "sqlite:///mlflow.db" and "restored" not in manifest
    client = MlflowClient(f"sqlite:///{path / 'mlflow.db'}")  # the project's real store, not the deleted workspace's
    parent = client.get_run(manifest["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["dvc.exp_name"] == "one-epoch"
    [trial] = manifest["trials"]
    run = client.get_run(trial["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_acc")] == [1]
    assert trial["checkpoint_dir"].startswith("results/ray/tune-")
    assert (path / trial["checkpoint_dir"] / "checkpoint.pt").is_file()  # the project's results/ray
    assert (path / "mlartifacts").is_dir() and run.info.artifact_uri.startswith((path / "mlartifacts").as_uri())
    leftovers = list((path / ".dvc/tmp/exps").glob("tmp*")) if (path / ".dvc/tmp/exps").is_dir() else []
    assert not leftovers  # DVC deleted the temporary workspace; nothing was lost with it


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_a_copied_then_moved_project_writes_and_reads_its_own_artifacts(queued: dict) -> None:
    """``cp -a proj proj2`` and a changed param: the trial that trains writes its checkpoint into proj2's
    ``mlartifacts``, the original's folder is unchanged, and the earlier run's artifacts download from the copy; after
    ``mv proj2 proj3`` (proj2 gone) they download from proj3."""
    original, path = queued["project"], queued["path"]
    before = _files(path / "mlartifacts")
    copy = path.with_name("proj2")
    subprocess.run(["cp", "-a", str(path), str(copy)], check=True)
    project = type(original)(copy, original.env)
    params = project.read_params()
    params["train"].update(epochs=1, lr=0.05)  # a new trial identity: it trains
    project.write_params(params)
    done = project.dvc("repro", "tune")
    moved_from = f"artifact locations moved from {(path / 'mlartifacts').as_uri()} to {(copy / 'mlartifacts').as_uri()}"
    assert moved_from in done.stdout + done.stderr  # said once, from where to where
    manifest = json.loads((copy / "results/tune/manifest.json").read_text())
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    [trial] = manifest["trials"]
    run = client.get_run(trial["run_id"])
    assert run.info.status == "FINISHED" and run.info.artifact_uri.startswith((copy / "mlartifacts").as_uri())
    assert (copy / "mlartifacts" / run.info.run_id / "artifacts/checkpoint/checkpoint.pt").is_file()
    assert _files(path / "mlartifacts") == before  # nothing written into the original's folder
    of_queued = MlflowClient(f"sqlite:///{path / 'mlflow.db'}").search_runs(
        [run.info.experiment_id], "tags.`dvc.exp_name` = 'one-epoch'"
    )
    [earlier] = [r for r in of_queued if "mlflow.parentRunId" in r.data.tags]  # the queued experiment's trial run
    from_copy = mlflow.artifacts.download_artifacts(
        run_id=earlier.info.run_id,
        artifact_path="checkpoint",
        dst_path=str(copy.with_name("from-copy")),
        tracking_uri=f"sqlite:///{copy / 'mlflow.db'}",
    )
    assert (Path(from_copy) / "checkpoint.pt").is_file()

    runs_before = len(client.search_runs([run.info.experiment_id]))
    moved = path.with_name("proj3")
    copy.rename(moved)
    project = type(original)(moved, original.env)
    done = project.run("python", "-m", "stages.tune")  # opens the moved store; the sweep is finished: nothing trains
    assert f"moved from {(copy / 'mlartifacts').as_uri()} to {(moved / 'mlartifacts').as_uri()}" in done.stderr
    after = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}")
    assert len(after.search_runs([run.info.experiment_id])) == runs_before  # no new run: the moved sweep is its own
    assert [m.step for m in after.get_metric_history(run.info.run_id, "test_acc")] == [1]  # no epoch trained again
    downloaded = mlflow.artifacts.download_artifacts(
        run_id=earlier.info.run_id,
        artifact_path="checkpoint",
        dst_path=str(moved.with_name("downloaded")),
        tracking_uri=f"sqlite:///{moved / 'mlflow.db'}",
    )
    assert (Path(downloaded) / "checkpoint.pt").is_file()
    location = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}").get_run(earlier.info.run_id).info.artifact_uri
    assert location.startswith((moved / "mlartifacts").as_uri())


def test_the_dry_run_after_a_queued_experiment_says_reuse(queued: dict) -> None:
    """With the queued experiment's params in the workspace, the dry run finds its finished run: reuse, not train.
    The queued run prepared its data in its own (deleted) workspace: until this one has it, the plan says so."""
    queued, path = queued["project"], queued["path"]
    original = (path / "params.yaml").read_text()
    params = queued.read_params()
    params["train"]["epochs"] = 1  # what the queued experiment ran (-S train.epochs=1)
    queued.write_params(params)
    try:
        before = queued.run("python", "-m", "stages.tune", "--dry-run").stdout
        queued.dvc("repro", "prepare")  # the same data, prepared here (deterministic; or checked out of the cache)
        dry = queued.run("python", "-m", "stages.tune", "--dry-run").stdout
    finally:
        (path / "params.yaml").write_text(original)
    [line] = [line for line in before.splitlines() if line.startswith("resnet18 ")]
    assert "unknown until the data is prepared" in line and "MISSING" in before, before
    manifest = json.loads(queued.run("git", "show", f"refs/exps/{_exp_ref(queued)}:results/tune/manifest.json").stdout)
    [trial] = manifest["trials"]
    [line] = [line for line in dry.splitlines() if line.startswith("resnet18 ")]
    assert line.endswith(f"reuse run {trial['run_id']}"), dry
    assert "finished: nothing to train" in dry, dry


def _exp_ref(queued: Project) -> str:
    refs = [line.split()[1] for line in queued.run("git", "show-ref").stdout.splitlines()]
    return next(ref for ref in refs if ref.startswith("refs/exps/") and ref.endswith("/one-epoch")).removeprefix(
        "refs/exps/"
    )
