"""Nothing depends on the project's absolute path: a copied or moved project's default MLflow store points at its own
artifact folder, the manifests hold project-relative paths, and the stores follow the DVC repository (a queued
experiment's temporary workspace is not the project)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import mlflow.artifacts
import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import TrackingConfig
from pipeline.finetune.manifest import FineTuneManifest, read_finetune_manifest, write_finetune_manifest
from pipeline.finetune.prune import PrunedModel
from pipeline.sweep.location import ARTIFACT_COLUMNS, store_root
from pipeline.sweep.manifest import TrialRecord, TuneManifest, read_tune_manifest, write_tune_manifest
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.parent import ParentRun, open_parent_run
from pipeline.sweep.tracking.store import tracking_uri


def _open(root: Path, *, default_store: bool = True) -> ParentRun:
    uri = tracking_uri(TrackingConfig(), root)
    return open_parent_run(
        uri,
        "copied",
        StoragePath(root / "results/ray/tune-x"),
        run_name="tune-x",
        tags={},
        params={},
        project_root=root,
        default_store=default_store,
    )


def _locations(root: Path) -> list[str]:
    """Every artifact location in the project's store (experiment ``Default`` aside: MLflow's own, never used)."""
    with sqlite3.connect(root / "mlflow.db") as db:
        found = [
            row[0]
            for table, column in ARTIFACT_COLUMNS
            for row in db.execute(f"SELECT {column} FROM {table} WHERE {column} LIKE 'file:%'")
        ]
    return [location for location in found if "/mlartifacts" in location]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def original(tmp_path: Path) -> tuple[Path, ParentRun, str]:
    """A project whose default store holds a run with an artifact, a logged model and a registered model version."""
    root = tmp_path / "proj"
    sweep = _open(root)
    client = MlflowClient(sweep.tracking_uri)
    run_id = client.create_run(sweep.experiment_id, run_name="trial").info.run_id
    (tmp_path / "checkpoint.txt").write_text("epoch 2")
    client.log_artifact(run_id, str(tmp_path / "checkpoint.txt"), artifact_path="checkpoint")
    model = client.create_logged_model(sweep.experiment_id, name="model", source_run_id=run_id)
    client.create_registered_model("copied-model")
    client.create_model_version("copied-model", source=model.artifact_location, run_id=run_id, model_id=model.model_id)
    return root, sweep, run_id


@pytest.mark.parametrize("how", ["cp -a", "mv"])
def test_a_copied_or_moved_project_uses_its_own_artifact_folder(original, tmp_path: Path, how: str) -> None:
    root, sweep, run_id = original
    before = _files(root / "mlartifacts")
    copy = tmp_path / "proj2"
    shutil.copytree(root, copy, symlinks=True) if how == "cp -a" else shutil.move(root, copy)
    assert all(loc.startswith(root.as_uri() + "/") for loc in _locations(copy))  # MLflow's absolute locations
    again = _open(copy)
    assert again.parent_run_id == sweep.parent_run_id
    locations = _locations(copy)
    assert len(locations) == 6 and all(loc.startswith((copy / "mlartifacts").as_uri()) for loc in locations)
    downloaded = mlflow.artifacts.download_artifacts(
        run_id=run_id,
        artifact_path="checkpoint/checkpoint.txt",
        dst_path=str(tmp_path / "dl"),
        tracking_uri=again.tracking_uri,
    )
    assert Path(downloaded).read_text() == "epoch 2"
    client = MlflowClient(again.tracking_uri)  # a new run and an artifact logged from the copy land in the copy
    new_run = client.create_run(again.experiment_id, run_name="after the copy").info.run_id
    client.log_artifact(new_run, str(tmp_path / "checkpoint.txt"), artifact_path="checkpoint")
    assert (copy / "mlartifacts" / new_run / "artifacts/checkpoint/checkpoint.txt").is_file()
    if how == "cp -a":
        assert _files(root / "mlartifacts") == before  # the original's folder and store are untouched
        assert all(loc.startswith(root.as_uri() + "/") for loc in _locations(root))


def test_a_store_the_user_named_is_never_rewritten(original, tmp_path: Path) -> None:
    root, _, _ = original
    copy = tmp_path / "proj2"
    shutil.copytree(root, copy, symlinks=True)
    _open(copy, default_store=False)  # tracking.uri given (here the same file): its locations stay as they are
    assert all(loc.startswith(root.as_uri() + "/") for loc in _locations(copy))


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_manifests_hold_no_absolute_project_path(tmp_path: Path) -> None:
    """Paths inside the project are written relative to it and read back against the reader's project root (a clone
    elsewhere); a path outside it (shared cluster storage) is kept; nothing flips on a restore (no ``restored``)."""
    root, clone, shared = tmp_path / "proj", tmp_path / "clone", tmp_path / "shared/ray"
    ray = root / "results/ray/tune-x"
    trials = [
        TrialRecord(
            "t0",
            "r0",
            "a-seed0",
            "a",
            0,
            "finished",
            2,
            {"test_acc": 0.5},
            str(ray / "t0/checkpoint_000001"),
            str(ray / "t0/checkpoint_000001/head_history.json"),
        ),
        TrialRecord("t1", "r1", "b-seed0", "b", 0, "finished", 2, {}, str(shared / "t1/checkpoint_000001"), None),
    ]
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tune_manifest = TuneManifest("x", "tune-x", str(ray), "test_acc", "max", uri, "1", "p", trials)
    write_tune_manifest(root / "results/tune/manifest.json", tune_manifest, root)
    prune_dir = root / "results/ray/prune-y"
    pruned = PrunedModel(
        "r0",
        "t0",
        "a",
        0,
        "f0",
        "a-pruned",
        "finished",
        1,
        [1],
        [8],
        2,
        1,
        {},
        {},
        0.5,
        0.2,
        0.4,
        str(prune_dir / "pruned/a"),
        str(prune_dir / "f0/c1"),
        [],
    )
    write_finetune_manifest(
        root / "results/prune/manifest.json",
        FineTuneManifest(
            "prune-y", str(root / "results/ray/prune-y"), "tune-x", uri, "1", "q", {}, [pruned], [], stage="prune"
        ),
        PrunedModel,
        root,
    )
    for stage in ("tune", "prune"):
        raw = json.loads((root / f"results/{stage}/manifest.json").read_text())
        assert not [s for s in _strings(raw) if str(root) in s], stage
        assert raw["tracking_uri"] == "sqlite:///mlflow.db" and "restored" not in raw
    shutil.copytree(root, clone)
    tune = read_tune_manifest(clone / "results/tune/manifest.json", clone)
    assert tune.tracking_uri == f"sqlite:///{clone / 'mlflow.db'}" and tune.ray_experiment_path == str(
        clone / ray.relative_to(root)
    )
    assert tune.trials[0].checkpoint_dir == str(clone / "results/ray/tune-x/t0/checkpoint_000001")
    assert tune.trials[0].head_history.endswith("/clone/results/ray/tune-x/t0/checkpoint_000001/head_history.json")
    assert tune.trials[1].checkpoint_dir == str(shared / "t1/checkpoint_000001") and tune.trials[1].head_history is None
    prune = read_finetune_manifest(clone / "results/prune/manifest.json", "prune", PrunedModel, clone)
    assert prune.models[0].pruned_checkpoint_dir == str(clone / "results/ray/prune-y/pruned/a")
    assert prune.tracking_uri == tune.tracking_uri


def test_the_stores_follow_the_dvc_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dvc exp run --queue`` runs a stage in ``.dvc/tmp/exps/<tmp>`` with ``DVC_ROOT`` naming the parent repository;
    ``dvc repro`` names the repository itself; outside DVC the working directory is the project."""
    workspace = tmp_path / "proj/.dvc/tmp/exps/tmpabc"
    workspace.mkdir(parents=True)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert store_root(workspace) == workspace
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "proj"))
    assert store_root(workspace) == tmp_path / "proj"
    assert store_root(tmp_path / "proj") == tmp_path / "proj"
