"""The tune stage submitted as a Ray job (``--submit``) to the real two-node cluster, from a "workstation" that is no
Ray node: the code and prepared data go up, the trials spread over both nodes, the manifest and metrics come back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.tracking import git_commit
from tests.cluster.conftest import ClusterProject, TwoNodeCluster, tiny_cluster_params
from tests.integration.conftest import MlflowServer, mlflow_server  # noqa: F401 (the fixture, for this folder too)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_the_sweep_submitted_as_a_job(cluster: TwoNodeCluster, cluster_project: ClusterProject,
                                      mlflow_server: MlflowServer, tmp_path: Path) -> None:  # noqa: F811  # fmt: skip
    params = tiny_cluster_params(uri=mlflow_server.uri)
    params["tracking"]["experiment"] = "it-cluster-job"
    params["sweep"]["storage_path"] = str(tmp_path / "shared-ray")  # both nodes see it: one machine
    params["train"]["epochs"] = 2  # a trial outlasts a worker process starting on the other node (else Tune reuses
    # the finished trial's actor on the head for the second trial)
    cluster_project.write_params(params)
    local = load_params(cluster_project.path / "params.yaml")  # what a run of these params here computes
    expected_name = experiment_name(local, prepared_data_hash(local, cluster_project.path))
    outputs = cluster_project.path / "results/tune"
    for name in ("manifest.json", "metrics.json"):
        (outputs / name).unlink(missing_ok=True)
    # The workstation: no Ray address, only the job server's and the token file.
    env = cluster.driver_env(RAY_ADDRESS=None, RAY_API_SERVER_ADDRESS=cluster.head.dashboard)
    try:
        started = time.monotonic()
        done = cluster_project.stage(env, "stages.tune", "--submit", "-v", timeout=500)
        seconds = time.monotonic() - started
    finally:
        cluster_project.write_params(tiny_cluster_params())
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    print(f"submitted two-node sweep (2 trials x 1 epoch) took {seconds:.1f} s")
    assert "submitted job tune-" in done.stderr and "its working_dir (the submitted package)" in done.stdout

    manifest = json.loads((outputs / "manifest.json").read_text())
    assert json.loads((outputs / "metrics.json").read_text())  # both DVC outputs are back in the repository
    assert {t["status"] for t in manifest["trials"]} == {"finished"} and len(manifest["trials"]) == 2
    # The sweep's identity is the one a local run of these params computes: not where data or tracking live.
    assert manifest["experiment_name"] == expected_name

    client = MlflowClient(mlflow_server.uri)
    parent = client.get_run(manifest["parent_run_id"])
    expected_commit = git_commit(cluster_project.path)  # the workstation's; the head has no .git ("unknown")
    assert parent.data.tags["git_commit"] == expected_commit != "unknown"
    assert parent.data.tags["mlflow.source.git.commit"] == expected_commit
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert {run.info.run_id for run in children} == {t["run_id"] for t in manifest["trials"]}
    assert {run.data.tags["git_commit"] for run in children} == {expected_commit}
    assert {run.data.tags["ray.node_id"] for run in children} == {cluster.head.node_id, cluster.worker.node_id}
