"""A missing or corrupt sqlite MLflow store, where the tune manifest says the runs are: every stage that reads the store
(tune, its dry run, prune, analyze) refuses in one line naming the file and the fix (exit 2), and none creates a new
empty store in its place (MLflow would, and then fail with ``No Experiment with id=...`` or an SQLAlchemy traceback)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.io import check_store
from pipeline.sweep.identity import experiment_name
from pipeline.sweep.manifest import FINISHED, TrialRecord, TuneManifest, write_tune_manifest
from pipeline.sweep.preflight import manifest_naming
from pipeline.sweep.tracking.store import prepare_store
from stages import analyze as analyze_stage
from stages import prune as prune_stage
from stages import tune as tune_stage

ROOT = Path(__file__).resolve().parents[4]
STAGES: dict[str, Callable[[], int]] = {
    "tune --dry-run": lambda: tune_stage.main(["--dry-run"]),
    "prune": lambda: prune_stage.main(["--dry-run"]),
    "analyze": lambda: analyze_stage.main(["--no-mlflow"]),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real MLflow sqlite store with one run (built once: a fresh schema takes seconds)."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    prepare_store(f"sqlite:///{path}")
    client = MlflowClient(f"sqlite:///{path}")
    experiment = client.create_experiment("attention-cnn")
    client.set_terminated(client.create_run(experiment).info.run_id)
    return path


@pytest.fixture
def project(tmp_path: Path, template: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose tune manifest names its default store, ``mlflow.db``, with one finished trial to prune."""
    raw = load_params(ROOT / "params.yaml").model_dump(mode="json")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "mlflow.db").write_bytes(template.read_bytes())
    params = load_params(tmp_path / "params.yaml")
    variant = params.prune_variants()[0]
    checkpoint = tmp_path / "results/ray/trial/checkpoint_000001"
    trial = TrialRecord("t1", "r" * 32, "run", variant, 0, FINISHED, 2, {"test_acc": 0.5}, str(checkpoint), None)
    manifest = TuneManifest(
        "hash",
        experiment_name(params, "missing"),
        str(tmp_path / "results/ray"),
        "test_acc",
        "max",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "1",
        "p" * 32,
        [trial],
    )
    write_tune_manifest(tmp_path / "results/tune/manifest.json", manifest, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setattr("pipeline.sweep.preflight.ray.is_initialized", lambda: False)
    return tmp_path


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_missing_store_is_named_and_not_created(project: Path, stage: str, caplog: pytest.LogCaptureFixture) -> None:
    (project / "mlflow.db").unlink()
    with caplog.at_level(logging.ERROR):
        assert STAGES[stage]() == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"{project / 'mlflow.db'}: the MLflow store that results/tune/manifest.json names is missing" in errors[0]
    assert "restore the file" in errors[0]
    assert not (project / "mlflow.db").exists()  # no new empty store


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_corrupt_store_is_named_with_the_fix(project: Path, stage: str, caplog: pytest.LogCaptureFixture) -> None:
    database = project / "mlflow.db"
    database.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.ERROR):
        assert STAGES[stage]() == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors[0].startswith(f"{database}: not an sqlite database (corrupt MLflow store); restore {database}")
    assert "Traceback" not in caplog.text


def test_store_checks(tmp_path: Path, template: Path) -> None:
    new = tmp_path / "new.db"
    check_store(f"sqlite:///{new}")  # a new project's store: created on first use
    check_store(f"sqlite:///{template}", Path("manifest.json"))  # a healthy store
    check_store("http://127.0.0.1:1")  # a server is checked by its /health
    new.touch()
    check_store(f"sqlite:///{new}")  # empty: MLflow builds its schema
    with pytest.raises(ValueError, match="holds no MLflow store"):
        check_store(f"sqlite:///{new}", Path("manifest.json"))
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(template.read_bytes()[:4096])
    with pytest.raises(ValueError, match=f"{truncated}: (unreadable|corrupt) MLflow store"):
        check_store(f"sqlite:///{truncated}")


def test_a_sweep_into_another_root_does_not_read_this_workspaces_manifest(project: Path, tmp_path_factory) -> None:
    """A benchmark sweeps into a temporary project from a checkout that has run ``make repro``: the checkout's
    manifest names *its* store (project-relative), which must not be resolved against the temporary root and then
    refused there as "missing"."""
    other = tmp_path_factory.mktemp("benchmark-project")
    uri = f"sqlite:///{other / 'mlflow.db'}"
    assert manifest_naming(f"sqlite:///{project / 'mlflow.db'}", project) is not None  # the project's own
    assert manifest_naming(uri, other) is None
    check_store(uri, manifest_naming(uri, other))  # a new store there: created on first use
