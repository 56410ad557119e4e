"""Job submission's checks, package and outputs, without a cluster: what is refused before anything is uploaded, what
the package holds, and how the outputs travel back through a real MLflow store."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from pipeline.config import load_params, parse_params
from pipeline.sweep.submit import (
    OUTPUTS_DIR,
    SubmittedJob,
    check_submittable,
    fetch_outputs,
    job_address,
    package_job,
    publish_outputs,
)

ROOT = Path(__file__).resolve().parents[4]
SERVER = "http://127.0.0.1:1"  # nothing listens on port 1: the check must fail on the server, not before


def _params(**changes: dict):
    raw = load_params(ROOT / "params.yaml").model_dump(mode="json")
    for section, values in changes.items():
        raw[section].update(values)
    return parse_params(raw, "test params")


def test_job_address_from_the_flag_or_rays_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    with pytest.raises(ValueError, match=r"--submit: give the cluster's dashboard .*RAY_API_SERVER_ADDRESS"):
        job_address("")
    assert job_address("10.0.0.5:8265") == "http://10.0.0.5:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "https://head:8265")
    assert job_address(None) == "https://head:8265"


def test_a_local_sqlite_store_is_refused(tmp_path: Path) -> None:
    for uri in (None, f"sqlite:///{tmp_path}/mlflow.db"):
        with pytest.raises(ValueError, match=r"^tracking\.uri: .* cluster cannot write"):
            check_submittable(_params(tracking={"uri": uri}), tmp_path)


def test_a_server_that_does_not_answer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^tracking\.uri: no MLflow server answers"):
        check_submittable(_params(tracking={"uri": SERVER}), tmp_path)


def test_a_relative_storage_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.sweep.submit.Store.check_answers", lambda store, source: None)
    with pytest.raises(ValueError, match=r"^sweep\.storage_path: 'results/ray' is relative"):
        check_submittable(_params(tracking={"uri": SERVER}), tmp_path)


def test_a_bucket_is_storage_a_job_can_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.sweep.submit.Store.check_answers", lambda store, source: None)
    params = _params(
        tracking={"uri": SERVER},
        sweep={"storage_path": "s3://bucket/ray"},
        data={"prepared_dir": "/mnt/shared/prepared"},
    )
    assert check_submittable(params, tmp_path) is None


def test_unprepared_data_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.sweep.submit.Store.check_answers", lambda store, source: None)
    params = _params(tracking={"uri": SERVER}, sweep={"storage_path": str(tmp_path / "ray")})
    with pytest.raises(FileNotFoundError, match=r"^data\.prepared_dir: .* no prepared dataset"):
        check_submittable(params, tmp_path)
    outside = _params(
        tracking={"uri": SERVER},
        sweep={"storage_path": str(tmp_path / "ray")},
        data={"prepared_dir": "/mnt/shared/prepared"},
    )
    assert check_submittable(outside, tmp_path) is None  # on the cluster's storage: not uploaded, not checked here


def test_the_package_is_what_git_ships_minus_rayignore_plus_the_prepared_data(tmp_path: Path) -> None:
    files = {
        "params.yaml": "seed: 0\n",
        "stages/tune.py": "",
        "notes/new.md": "untracked, not ignored\n",
        ".gitignore": "/data/prepared\n/mlflow.db\n",
        ".rayignore": "/data/\n*.db\nbig/\n",
        "big/blob.bin": "x",
        "mlflow.db": "",
        "data/prepared/manifest.json": "{}",
        "data/prepared/train.pt": "t",
        "data/raw.csv": "ignored by .rayignore",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "params.yaml", "stages", ".gitignore", ".rayignore"], cwd=tmp_path, check=True)
    (tmp_path / "out").mkdir()
    archive = package_job(tmp_path, tmp_path / "data/prepared", tmp_path / "out")
    names = set(zipfile.ZipFile(archive).namelist())
    assert names == {
        "params.yaml",
        "stages/tune.py",
        "notes/new.md",
        ".gitignore",
        ".rayignore",
        "data/prepared/manifest.json",
        "data/prepared/train.pt",
    }


def test_a_folder_outside_git_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a git checkout"):
        package_job(tmp_path, None, tmp_path)


def test_outputs_travel_through_the_parent_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("jobs", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(experiment).info.run_id
    job = SubmittedJob("tune-abc-20261124-030000", "0123abc")
    with pytest.raises(FileNotFoundError, match=f"job {job.submission_id} published no outputs"):
        fetch_outputs(uri, "jobs", job.submission_id, tmp_path / "back", ["manifest.json"])
    client.set_tag(parent, "ray.job_submission_id", job.submission_id)  # as the job's parent run has from its start
    with pytest.raises(FileNotFoundError, match=r"did not publish manifest\.json"):
        fetch_outputs(uri, "jobs", job.submission_id, tmp_path / "back", ["manifest.json"])
    written = tmp_path / "job" / "manifest.json"
    written.parent.mkdir()
    written.write_text(json.dumps({"parent_run_id": parent}))
    publish_outputs(uri, parent, [written], job)
    assert [a.path for a in client.list_artifacts(parent, OUTPUTS_DIR)] == [f"{OUTPUTS_DIR}/manifest.json"]
    assert fetch_outputs(uri, "jobs", job.submission_id, tmp_path / "back", ["manifest.json"]) == parent
    assert json.loads((tmp_path / "back" / "manifest.json").read_text()) == {"parent_run_id": parent}
