"""The tune stage submitted as a Ray job (``--submit``) to the real two-node cluster, from a "workstation" that is no
Ray node: the code and prepared data go up, the trials spread over both nodes, the manifest and metrics come back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.tracking.tags import git_commit
from tests.cluster.conftest import ClusterProject, LocalCluster, tiny_cluster_params
from tests.integration.conftest import MlflowServer, mlflow_server  # noqa: F401 (the fixture, for this folder too)

if TYPE_CHECKING:
    from tests.conftest import Bucket

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
STOP_EPOCHS = 6  # the Ctrl-C test's trials, one at a time: long enough that the stop lands mid-sweep


def test_the_sweep_submitted_as_a_job(
    cluster: LocalCluster,
    cluster_project: ClusterProject,
    mlflow_server: MlflowServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """Storage in a folder both nodes see (one machine); the next test's job checkpoints into a bucket."""
    params = tiny_cluster_params(uri=mlflow_server.uri)
    params["tracking"]["experiment"] = "it-cluster-job"
    params["sweep"]["storage_path"] = str(tmp_path / "shared-ray")
    # Trials outlast a worker process starting on the other node on a busy machine (else Tune reuses the finished
    # trial's actor on the head for the second trial, and both run there).
    params["train"]["epochs"] = 3
    cluster_project.write_params(params)
    local = load_params(cluster_project.path / "params.yaml")  # what a run of these params here computes
    expected_name = experiment_name(local, prepared_data_hash(local, cluster_project.path))
    expected_commit = git_commit(cluster_project.path)  # the workstation's at submission; the head has no .git
    outputs = cluster_project.path / "results/tune"
    for name in ("manifest.json", "metrics.json", "test_acc.json"):
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
    print(f"submitted two-node sweep (2 trials x 3 epochs) took {seconds:.1f} s")
    assert "submitted job tune-" in done.stderr and "its working_dir (the submitted package)" in done.stdout

    manifest = json.loads((outputs / "manifest.json").read_text())
    for name in ("metrics.json", "test_acc.json"):  # the stage's DVC outputs are back in the repository
        assert json.loads((outputs / name).read_text()), name
    assert {t["status"] for t in manifest["trials"]} == {"finished"} and len(manifest["trials"]) == 2
    # The sweep's identity is the one a local run of these params computes: not where data or tracking live.
    assert manifest["experiment_name"] == expected_name

    client = MlflowClient(mlflow_server.uri)
    parent = client.get_run(manifest["parent_run_id"])
    assert parent.data.tags["git_commit"] == expected_commit != "unknown"
    assert parent.data.tags["mlflow.source.git.commit"] == expected_commit
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert {run.info.run_id for run in children} == {t["run_id"] for t in manifest["trials"]}
    assert {run.data.tags["git_commit"] for run in children} == {expected_commit}
    assert {run.data.tags["ray.node_id"] for run in children} == {cluster.head.node_id, cluster.worker.node_id}


def test_ctrl_c_stops_the_job_and_a_resubmission_resumes(
    cluster: LocalCluster,
    cluster_project: ClusterProject,
    mlflow_server: MlflowServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    bucket: Bucket,
) -> None:
    """Ctrl-C on the workstation stops the job as Ctrl-C stops a local run (its runs closed, nothing RUNNING); the
    next submission resumes the same runs from their checkpoints in a bucket (on the S3-compatible test server, which
    the workstation never reads), each epoch logged once, and the manifest names them there."""
    params = tiny_cluster_params(uri=mlflow_server.uri)
    params["tracking"]["experiment"] = "it-cluster-job-stop"
    params["sweep"]["storage_path"] = bucket.uri("ray")
    # A tiny epoch takes about a second and the stop travels workstation -> job server -> job driver -> Tune in a
    # few: 6 epochs, one trial at a time (the second still pending when the first has saved its first epoch), so
    # the stop lands mid-sweep however loaded the machine (3 epochs of both trials at once left about 2 s).
    params["train"]["epochs"] = STOP_EPOCHS
    params["sweep"]["max_concurrent_trials"] = 1
    cluster_project.write_params(params)
    env = cluster.driver_env(RAY_ADDRESS=None, RAY_API_SERVER_ADDRESS=cluster.head.dashboard)
    client = MlflowClient(mlflow_server.uri)
    log = (tmp_path / "first.log").open("w+")
    first = subprocess.Popen(
        [sys.executable, "-m", "stages.tune", "--submit"],
        cwd=cluster_project.path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        # A trial has saved its first epoch in the bucket (the test's own read of the S3 server, not requests to the
        # MLflow server the job writes to): stop the job.
        while not [key for key in bucket.keys("ray") if key.endswith("checkpoint_000000/checkpoint.pt")]:
            assert first.poll() is None and time.monotonic() < deadline, _tail(log)
            time.sleep(0.2)
        signalled = f"SIGINT at {time.strftime('%H:%M:%S')}, the stage {'running' if first.poll() is None else 'ended'}"
        first.send_signal(signal.SIGINT)
        first.wait(timeout=200)
        output = _tail(log)
        assert first.returncode == 130 and "ended STOPPED" in output, f"{signalled}:\n{output}"
        stopped = _trial_runs(client, "it-cluster-job-stop")  # created when their trials started
        assert stopped, output
        experiment = client.get_experiment_by_name("it-cluster-job-stop").experiment_id
        assert "RUNNING" not in {run.info.status for run in client.search_runs([experiment])}  # closed by the stop
        second = cluster_project.stage(env, "stages.tune", "--submit", timeout=500)
    finally:
        if first.poll() is None:
            first.kill()
        cluster_project.write_params(tiny_cluster_params())
    assert second.returncode == 0, f"{second.stdout[-3000:]}\n{second.stderr[-5000:]}"
    manifest = json.loads((cluster_project.path / "results/tune/manifest.json").read_text())
    assert {t["status"] for t in manifest["trials"]} == {"finished"}
    assert manifest["ray_experiment_path"] == bucket.uri(f"ray/{manifest['experiment_name']}")
    last = f"checkpoint_{STOP_EPOCHS - 1:06d}/checkpoint.pt"
    assert sum(key.endswith(last) for key in bucket.keys("ray")) == 2
    resumed = _epochs_by_run(client, "it-cluster-job-stop")
    assert set(resumed) == {t["run_id"] for t in manifest["trials"]} >= set(stopped)  # the same runs, continued
    every_epoch = list(range(1, STOP_EPOCHS + 1))
    assert all(steps == every_epoch for steps in resumed.values()), resumed  # none lost, none twice
    print(f"stopped runs {stopped}; epochs after the resubmission {resumed}")


def _trial_runs(client: MlflowClient, experiment: str) -> list[str]:
    """The ids of the experiment's trial runs (children of a sweep run)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return [r.info.run_id for r in client.search_runs([found.experiment_id]) if "mlflow.parentRunId" in r.data.tags]


def _epochs_by_run(client: MlflowClient, experiment: str) -> dict[str, list[int]]:
    """Per trial run of the experiment, the epochs it logged (runs without any left out)."""
    steps = {
        run: sorted(m.step for m in client.get_metric_history(run, "test_acc"))
        for run in _trial_runs(client, experiment)
    }
    return {run_id: epochs for run_id, epochs in steps.items() if epochs}


def _tail(log: IO[str]) -> str:
    log.seek(0)
    return log.read()[-6000:]
