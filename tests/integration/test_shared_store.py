"""Two projects sharing one fresh sqlite MLflow store start their sweeps at the same moment: MLflow builds the schema
of a new database on first use, and two processes doing it at once crashed in the migration. Both must open their
sweep run, with no traceback. And two projects with the same params, tuning together on one store (sqlite file, a
server on sqlite, or a lab's server on PostgreSQL), train each trial identity once: one claims it, the other waits
and reuses the run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import MlflowServer, Project, tiny_params
from tests.lab_store import LabStore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OPEN_SWEEP = """
import sys, time
from pathlib import Path
from pipeline.sweep.tracking.parent import open_parent_run
from pipeline.sweep.storage import StoragePath
uri, go, project = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():  # every process has imported MLflow: start together
    time.sleep(0.005)
sweep = open_parent_run(uri, "shared", StoragePath(project / "ray"), run_name=project.name, tags={},
                                params={"p": "1"}, project_root=project)
print(sweep.parent_run_id)
"""


def test_two_projects_create_one_fresh_sqlite_store_at_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    go = tmp_path / "go"
    projects = [tmp_path / f"project{i}" for i in range(3)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_SWEEP, uri, str(go), str(project)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for project in projects
    ]
    assert all(process.stdout.readline().strip() == "ready" for process in processes)  # MLflow imported by all
    go.touch()
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0 and "Traceback" not in err, err[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shared")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == [p.name for p in projects]
    assert sorted(r.info.run_id for r in runs) == sorted(out.strip() for out, _ in outputs)


SHARED_TRIALS = {"variants": ["resnet18"], "seeds": [31, 32]}  # seeds no other test trains


def _copies(project: Project, tmp_path: Path, uri: str, experiment: str) -> list[Project]:
    """Two clones of the session's project with the same params, tracking into ``uri``, their data prepared."""
    copies = []
    for name in ("lab-a", "lab-b"):
        path = tmp_path / name
        ignore = shutil.ignore_patterns("results", "mlflow.db*", "mlartifacts", ".dvc", "dvc.lock")
        shutil.copytree(project.path, path, ignore=ignore)
        copy = Project(path, project.env)
        params = tiny_params()
        params["sweep"].update(SHARED_TRIALS)
        copy.write_params({**params, "tracking": {"uri": uri, "experiment": experiment, "system_metrics": False}})
        copy.run("python", "-m", "stages.prepare")
        copies.append(copy)
    return copies


def _tune_together(copies: list[Project]) -> list[str]:
    stages = [copy.start_tune() for copy in copies]
    try:
        outputs = [stage.communicate(timeout=600)[0] for stage in stages]
    finally:
        for copy in copies:  # one that timed out would train on, in the next test's time
            copy.stop_started()
    for stage, output in zip(stages, outputs, strict=True):
        assert stage.returncode == 0, output[-4000:]
    return outputs


def _assert_each_trial_trained_once(uri: str, experiment: str, copies: list[Project], outputs: list[str]) -> None:
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = [r for r in client.search_runs([experiment_id]) if "trial_key" in r.data.tags]
    keys = [r.data.tags["trial_key"] for r in runs]
    assert len(keys) == len(SHARED_TRIALS["seeds"]) and len(set(keys)) == len(keys), keys  # one run per identity
    assert all(r.info.status == "FINISHED" for r in runs)
    manifests = [json.loads((c.path / "results/tune/manifest.json").read_text()) for c in copies]
    listed = [sorted(t["run_id"] for t in m["trials"]) for m in manifests]
    assert listed[0] == listed[1] == sorted(r.info.run_id for r in runs)  # the loser reused the winner's runs
    assert sum("waiting for 2 trial(s)" in output for output in outputs) == 1, outputs[0][-3000:]
    claims = client.get_experiment_by_name(f"{experiment}.claims")
    assert all(r.info.status != "RUNNING" for r in client.search_runs([claims.experiment_id]))  # all released


def test_two_projects_on_one_sqlite_store_train_each_trial_once(project: Project, tmp_path: Path) -> None:
    uri, experiment = f"sqlite:///{tmp_path / 'lab' / 'mlflow.db'}", "it-shared-sqlite"
    copies = _copies(project, tmp_path, uri, experiment)
    outputs = _tune_together(copies)
    _assert_each_trial_trained_once(uri, experiment, copies, outputs)


def test_two_projects_on_one_server_train_each_trial_once(
    project: Project, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    experiment = f"it-shared-server-{tmp_path.name}"
    copies = _copies(project, tmp_path, mlflow_server.uri, experiment)
    outputs = _tune_together(copies)
    _assert_each_trial_trained_once(mlflow_server.uri, experiment, copies, outputs)


def test_two_projects_on_a_postgresql_server_train_each_trial_once(
    project: Project, lab_store: LabStore, tmp_path: Path
) -> None:
    """The claims on a lab's store (examples/lab_store.sh: PostgreSQL 15, artifacts in a bucket): same outcome."""
    experiment = f"it-shared-postgresql-{tmp_path.name}"
    copies = _copies(project, tmp_path, lab_store.uri, experiment)
    outputs = _tune_together(copies)
    _assert_each_trial_trained_once(lab_store.uri, experiment, copies, outputs)
