"""Two projects sharing one fresh sqlite MLflow store start their sweeps at the same moment: MLflow builds the schema
of a new database on first use, and two processes doing it at once crashed in the migration. Both must open their
sweep run, with no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

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
