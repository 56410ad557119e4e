"""The tune stage attached to a real two-node Ray cluster (token auth on, all on 127.0.0.1), as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cluster.conftest import (
    ClusterProject,
    LocalCluster,
    epochs_logged,
    run_tags,
    tiny_cluster_params,
    wait_for_alive_nodes,
)

if TYPE_CHECKING:
    from tests.conftest import Bucket

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
FAIL_FAST_S = 60  # a hang guard: the stage's own start (torch, Ray, MLflow imports) is most of it on a busy machine
CHECK_S = 5  # the attach check itself: Ray alone retries ~20 s before a bare ConnectionError


def _failed_fast(done: subprocess.CompletedProcess, seconds: float, *needles: str) -> str:
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line and "run with -v" not in line]
    last = errors[-1] if errors else ""
    assert done.returncode == 2, f"rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    for needle in needles:
        assert needle in last, last
    assert seconds < FAIL_FAST_S, f"took {seconds:.1f} s: {last}"
    return last


def _attach_check(project: ClusterProject, env: dict[str, str]) -> tuple[str, float]:
    """The stage's attach check alone, timed after the imports: its message and seconds."""
    code = (
        "import sys, time\n"
        "from pipeline.config import parse_params\n"
        "from pipeline.sweep.session import check_attachable, prepare_driver_env, ray_address\n"
        "sweep = parse_params({}, 'test').sweep\n"
        "prepare_driver_env(sweep)\n"
        "import ray._raylet\n"
        "started = time.monotonic()\n"
        "try:\n    check_attachable(ray_address(sweep))\n    print('attached')\n"
        "except ValueError as err:\n    print(err)\n"
        "print(time.monotonic() - started)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=project.path, env=env, capture_output=True, text=True)
    *_, message, seconds = done.stdout.strip().splitlines()
    assert float(seconds) < CHECK_S, f"{message}: {seconds} s"
    return message, float(seconds)


def _dry_run(project: ClusterProject, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = project.stage(env, "stages.tune", "--dry-run", timeout=120)
    return done, time.monotonic() - started


def test_sweep_spreads_over_both_nodes(cluster: LocalCluster, cluster_project: ClusterProject) -> None:
    cluster_project.write_params(tiny_cluster_params(sqlite_on_cluster=True))
    started = time.monotonic()
    done = cluster_project.stage(cluster.driver_env(), "stages.tune")
    seconds = time.monotonic() - started
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    print(f"two-node sweep (2 trials x 1 epoch) took {seconds:.1f} s")
    manifest = json.loads((cluster_project.path / "results/tune/manifest.json").read_text())
    assert {t["status"] for t in manifest["trials"]} == {"finished"} and len(manifest["trials"]) == 2
    by_run = run_tags(cluster_project.path / "mlflow.db")
    children = {run: t for run, t in by_run.items() if t.get("mlflow.parentRunId") == manifest["parent_run_id"]}
    assert set(children) == {t["run_id"] for t in manifest["trials"]}  # every trial's run, under the one parent
    assert {t["ray.node_id"] for t in children.values()} == {cluster.head.node_id, cluster.worker.node_id}
    assert all(t["ray.node_ids"] == t["ray.node_id"] for t in children.values())  # nobody moved
    assert "shipping the code" in done.stderr and "cluster: 2 nodes share" in done.stderr


def test_a_bucket_is_storage_every_node_shares(
    cluster: LocalCluster, cluster_project: ClusterProject, bucket: Bucket
) -> None:
    """``sweep.storage_path: s3://...`` on two nodes: the probe proves every node reads and writes the bucket with its
    own credentials, trials on both nodes checkpoint there, and nothing of the Ray results is on the driver's disk."""
    params = tiny_cluster_params(sqlite_on_cluster=True)
    params["train"]["epochs"] = 2
    params["sweep"].update(seeds=[7], storage_path=bucket.uri("ray"))  # a seed of its own: nothing to reuse
    cluster_project.write_params(params)
    try:
        done = cluster_project.stage(cluster.driver_env(), "stages.tune")
    finally:
        cluster_project.write_params(tiny_cluster_params())
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert f"cluster: 2 nodes share {bucket.uri('ray')}" in done.stderr
    manifest = json.loads((cluster_project.path / "results/tune/manifest.json").read_text())
    assert manifest["ray_experiment_path"] == bucket.uri(f"ray/{manifest['experiment_name']}")
    keys = bucket.keys("ray")
    for trial in manifest["trials"]:
        assert trial["status"] == "finished"
        assert trial["checkpoint_dir"].startswith(f"s3://{bucket.name}/ray/{manifest['experiment_name']}/")
    assert sum(key.endswith("checkpoint_000001/checkpoint.pt") for key in keys) == 2
    assert not any(".storage-probe-" in key for key in keys)  # the probe's markers are removed
    children = [
        t
        for t in run_tags(cluster_project.path / "mlflow.db").values()
        if t.get("mlflow.parentRunId") == manifest["parent_run_id"]
    ]
    assert {t["ray.node_id"] for t in children} == {cluster.head.node_id, cluster.worker.node_id}
    assert not (cluster_project.path / "results/ray" / manifest["experiment_name"]).exists()


def test_wrong_token_fails_fast_naming_what_to_do(cluster: LocalCluster, cluster_project: ClusterProject) -> None:
    env = cluster.driver_env(RAY_AUTH_TOKEN="not-the-cluster-token-0123456789")
    done, seconds = _dry_run(cluster_project, env)
    last = _failed_fast(
        done, seconds, "sweep.ray_address", "refused the token from $RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
    )
    message, check_s = _attach_check(cluster_project, env)
    assert message in last
    print(f"wrong token: stage exited 2 after {seconds:.1f} s, the check itself took {check_s:.3f} s")


def test_missing_token_fails_fast(cluster: LocalCluster, cluster_project: ClusterProject, tmp_path: Path) -> None:
    env = cluster.driver_env(RAY_AUTH_TOKEN_PATH=None, HOME=str(tmp_path))  # no ~/.ray/auth_token either
    done, seconds = _dry_run(cluster_project, env)
    last = _failed_fast(done, seconds, "sweep.ray_address", "refused no token", "~/.ray/auth_token")
    assert _attach_check(cluster_project, env)[0] in last


def test_nothing_at_the_address_fails_fast(cluster: LocalCluster, cluster_project: ClusterProject) -> None:
    from tests.cluster.conftest import free_port

    env = cluster.driver_env(RAY_ADDRESS=f"127.0.0.1:{free_port()}")
    done, seconds = _dry_run(cluster_project, env)
    last = _failed_fast(done, seconds, "sweep.ray_address: cannot attach")
    assert _attach_check(cluster_project, env)[0] in last


def test_sqlite_store_on_a_multi_node_cluster_is_refused(
    cluster: LocalCluster, cluster_project: ClusterProject
) -> None:
    cluster_project.write_params(tiny_cluster_params())
    done, seconds = _dry_run(cluster_project, cluster.driver_env())
    _failed_fast(done, seconds, "tracking.uri", "tracking.sqlite_on_cluster: true")


def test_storage_a_node_does_not_share_is_refused(
    cluster: LocalCluster, cluster_project: ClusterProject, tmp_path: Path
) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to give one node a private mount over the storage path")
    storage = tmp_path / "storage"
    storage.mkdir()
    # A third node whose view of `storage` is a private tmpfs: a node without the shared file system.
    mount = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs tmpfs "$0" && exec "$@"',
        str(storage),
    ]
    if subprocess.run([*mount, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a private mount here (needs root or user namespaces)")
    node = cluster.start_node("worker", cluster.address, prefix=mount)
    cluster.extra.append(node)
    try:
        params = tiny_cluster_params(sqlite_on_cluster=True)
        params["sweep"]["storage_path"] = str(storage)
        cluster_project.write_params(params)
        done, seconds = _dry_run(cluster_project, cluster.driver_env())
        last = _failed_fast(done, seconds, "sweep.storage_path", "is not shared", node.node_id[:8])
        print(f"refused in {seconds:.1f} s: {last}")
    finally:
        node.stop()
        cluster.extra.remove(node)
        cluster_project.write_params(tiny_cluster_params())
        wait_for_alive_nodes(cluster, 2)


def test_a_node_that_joins_after_the_preflight_and_does_not_share_the_storage_fails_its_trial(
    cluster: LocalCluster, cluster_project: ClusterProject, tmp_path: Path
) -> None:
    """A cluster that grows after the sweep started (an autoscaler adding GPU workers): the preflight probed the two
    nodes there were, which share the storage; the trial, which needs a GPU none of them has, waits for the GPU node
    that joins later, whose view of the storage is a private tmpfs. The trial checks its own node and fails with the
    preflight's message, before training."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to give one node a private mount over the storage path")
    storage = tmp_path / "storage"
    storage.mkdir()
    mount = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"']
    if subprocess.run([*mount, str(storage), "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a private mount here (needs root or user namespaces)")
    params = tiny_cluster_params(sqlite_on_cluster=True)
    params["tracking"]["experiment"] = "it-cluster-late-node"
    params["sweep"].update(
        storage_path=str(storage),
        variants=["resnet18"],
        max_failures=0,
        resources={"cpu": 1, "gpu": 1, "cpu_fallback": True},
    )
    cluster_project.write_params(params)
    started = time.monotonic()
    stage = subprocess.Popen(
        [sys.executable, "-m", "stages.tune"],
        cwd=cluster_project.path,
        env=cluster.driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    node = None
    try:
        deadline = time.monotonic() + 180
        while not list(storage.glob("tune-*/.node-check")):  # the sweep's Tuner is built: the preflight is over
            assert stage.poll() is None and time.monotonic() < deadline, "the sweep never started"
            time.sleep(0.5)
        node = cluster.start_node("worker", cluster.address, [*mount, str(storage)], gpus=1)
        cluster.extra.append(node)
        output, _ = stage.communicate(timeout=300)
    finally:
        if stage.poll() is None:
            stage.kill()
        if node is not None:
            node.stop()
            cluster.extra.remove(node)
        cluster_project.write_params(tiny_cluster_params())
    seconds = time.monotonic() - started
    assert stage.returncode != 0, output[-4000:]
    message = f"sweep.storage_path: {storage} is not shared: node 127.0.0.1 ({node.node_id[:8]}) does not see"
    assert message in output, output[-6000:]
    manifest = json.loads((cluster_project.path / "results/tune/manifest.json").read_text())
    [trial] = manifest["trials"]
    assert trial["status"] != "finished"
    print(f"the late node's trial failed in {seconds:.0f} s (the sweep's start included): {message}")
    wait_for_alive_nodes(cluster, 2, timeout_s=120)


def test_a_worker_node_killed_mid_trial(cluster: LocalCluster, cluster_project: ClusterProject) -> None:
    """SIGKILL of every process of the worker node while its trial trains: the trial finishes on the head from its
    last checkpoint, in the same run, each epoch logged once, and the run names both nodes it ran on."""
    params = tiny_cluster_params(sqlite_on_cluster=True)
    # Enough epochs (about half a second each) that the trial still trains when its first one is seen in the store:
    # the driver's writer thread logs an epoch a moment after the trial reported it, longer while it logs a model.
    epochs = params["train"]["epochs"] = 10
    params["tracking"]["experiment"] = "it-cluster-kill"
    cluster_project.write_params(params)
    db = cluster_project.path / "mlflow.db"
    command = [sys.executable, "-m", "stages.tune"]
    stage = subprocess.Popen(
        command,
        cwd=cluster_project.path,
        env=cluster.driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    victim, killed_node = None, cluster.worker.node_id
    try:
        deadline = time.monotonic() + 300
        while victim is None:  # the worker node's trial has logged its first epoch: kill the node
            assert stage.poll() is None and time.monotonic() < deadline, "the worker node's trial never trained"
            runs = run_tags(db) if db.exists() else {}
            on_worker = [
                r
                for r, t in runs.items()
                if t.get("ray.node_id") == cluster.worker.node_id and t.get("tune.status") != "finished"
            ]
            if on_worker and epochs_logged(db, on_worker[0]):
                victim = on_worker[0]
                killed = cluster.worker.kill()
            time.sleep(0.2)
        output, _ = stage.communicate(timeout=400)
        assert stage.returncode == 0, output[-6000:]
    finally:
        if stage.poll() is None:
            stage.kill()
        cluster.worker.stop()
        cluster.worker = cluster.start_node("worker", cluster.address)  # the other tests expect two nodes
        cluster_project.write_params(tiny_cluster_params())
    killed_at = epochs_logged(db, victim)
    manifest = json.loads((cluster_project.path / "results/tune/manifest.json").read_text())
    assert {t["status"] for t in manifest["trials"]} == {"finished"}
    runs = run_tags(db)
    children = {r for r, t in runs.items() if t.get("mlflow.parentRunId") == manifest["parent_run_id"]}
    assert children == {t["run_id"] for t in manifest["trials"]}  # one run per trial: no orphan from the retry
    assert killed_at == list(range(1, epochs + 1))  # every epoch once: none lost, none logged twice
    assert runs[victim]["ray.node_ids"] == f"{killed_node},{cluster.head.node_id}"
    assert runs[victim]["ray.node_id"] == cluster.head.node_id
    print(
        f"killed {killed} processes of the worker node; the trial's run: nodes {runs[victim]['ray.node_ids']}, "
        f"epochs {killed_at}, retries {runs[victim].get('tune.retries')}"
    )
    wait_for_alive_nodes(cluster, 2, timeout_s=120)
