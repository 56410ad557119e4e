"""The whole pipeline submitted as one Ray job (``python -m stages.submit``) to the real two-node cluster, from a
"workstation" that is no Ray node: every stage runs in the job, the trials on both nodes, and dvc.lock and every
output come back, so that ``dvc status`` is clean here. The job's PATH finds another ``python`` first, one that
fails: every stage still runs with the environment's interpreter the submission named."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from pipeline.sweep.tracking.tags import git_commit
from stages._job import entrypoint
from tests.cluster.conftest import VENV_BIN, ClusterProject, LocalCluster, tiny_cluster_params
from tests.integration.conftest import MlflowServer, mlflow_server  # noqa: F401 (the fixture, for this folder too)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
STAGES = ("prepare", "tune", "prune", "transform", "analyze")


def _interpreter_behind_another_python(folder: Path) -> Path:
    """``folder/env-python``: the project's interpreter, started with PATH's first ``python`` another one
    (``folder/other/python``, which fails saying so), as on a node whose image has its own Python first."""
    other = folder / "other"
    other.mkdir()
    (other / "python").write_text('#!/bin/sh\necho "not the project\'s python: $0 $*" >&2\nexit 97\n')
    launcher = folder / "env-python"
    launcher.write_text(f'#!/bin/sh\nPATH="{other}:$PATH" exec "{VENV_BIN / "python"}" "$@"\n')
    for script in (other / "python", launcher):
        script.chmod(0o755)
    return launcher


def test_the_whole_pipeline_as_one_job(
    cluster: LocalCluster,
    cluster_project: ClusterProject,
    mlflow_server: MlflowServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    params = tiny_cluster_params(uri=mlflow_server.uri)
    params["tracking"]["experiment"] = "it-cluster-pipeline"
    params["sweep"]["storage_path"] = str(tmp_path / "shared-ray")
    params["sweep"]["variants"] = ["sa_generalized_9", "resnet18"]  # one to prune, one to rebuild as attention
    params["train"]["epochs"] = 3  # trials outlast a worker's start on the other node (test_job_submission.py)
    params["prune"].update(mode="fraction", fraction=0.5, epochs=1)
    params["transform"]["epochs"] = 1
    project = cluster_project.path
    lock_before = (project / "dvc.lock").read_text() if (project / "dvc.lock").is_file() else None
    cluster_project.write_params(params)
    python = _interpreter_behind_another_python(tmp_path)
    env = cluster.driver_env(RAY_ADDRESS=None, RAY_API_SERVER_ADDRESS=cluster.head.dashboard)
    expected_commit = None
    try:
        started = time.monotonic()
        done = cluster_project.stage(env, "stages.submit", "--python", str(python), timeout=900)
        seconds = time.monotonic() - started
        expected_commit = git_commit(project)
        status = subprocess.run(
            [sys.executable, "-m", "dvc", "status", "--json"], cwd=project, env=env, capture_output=True, text=True
        )
        lock = (project / "dvc.lock").read_text()
    finally:
        cluster_project.write_params(tiny_cluster_params())
        if lock_before is None:
            (project / "dvc.lock").unlink(missing_ok=True)
        else:
            (project / "dvc.lock").write_text(lock_before)
    output = f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, output
    print(f"the whole tiny pipeline as one job (2 trials x 3 epochs, a prune, a transform) took {seconds:.1f} s")
    # The job's entrypoint was the tested one; PATH's first python was another, every stage ran with the named one.
    assert "Running entrypoint for job pipeline-" in done.stdout and entrypoint(str(python)) in done.stdout, output
    assert f"every stage runs with {VENV_BIN / 'python'} (the first python on PATH was {tmp_path}/other/python)" in (
        done.stdout
    ), output
    assert "not the project's python" not in output
    for name in ("tune", "prune", "transform", "analyze"):  # run by DVC in the job (prepare: shipped, recorded)
        assert f"Running stage '{name}'" in done.stdout, output
    # Outputs and dvc.lock are back; DVC here sees nothing to do.
    assert json.loads(status.stdout) == {}, f"{status.stdout}\n{status.stderr}"
    assert set(yaml.safe_load(lock)["stages"]) == set(STAGES)
    for out in ("results/prune/manifest.json", "results/transform/manifest.json", "results/report.md"):
        assert (project / out).is_file(), out
    assert list((project / "results/figures").glob("*.png"))
    manifest = json.loads((project / "results/tune/manifest.json").read_text())
    assert {t["status"] for t in manifest["trials"]} == {"finished"} and len(manifest["trials"]) == 2
    assert json.loads((project / "results/prune/manifest.json").read_text())["models"], "nothing was pruned"

    client = MlflowClient(mlflow_server.uri)
    parent = client.get_run(manifest["parent_run_id"])
    assert parent.data.tags["git_commit"] == expected_commit != "unknown"  # the workstation's, through the metadata
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert {run.data.tags["ray.node_id"] for run in children} == {cluster.head.node_id, cluster.worker.node_id}
