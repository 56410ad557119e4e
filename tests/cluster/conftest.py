"""A real multi-node Ray cluster on this machine and a copy of the project whose tune stage attaches to it; and a real
SLURM cluster (``slurm_cluster``, ``tests/cluster/slurm.py``) with a tracking server its nodes reach.

The session's cluster (``local_cluster.py``) has two nodes (a head and a worker) of one CPU each; a module adds nodes
of its own (more CPUs, declared GPUs) with ``LocalCluster.start_node`` and stops them when it is done. Each node
offers one CPU: the machine is small and shared.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipeline.sweep.tracking.server import MlflowServer
from tests.cluster.local_cluster import (  # noqa: F401 (the cluster tests import them from here)
    VENV_BIN,
    LocalCluster,
    RayNode,
    free_port,
    start_cluster,
    stop_cluster,
)
from tests.cluster.slurm import SlurmCluster, slurm_missing, start_slurm_cluster, stop_slurm_cluster
from tests.project_copy import copy_project

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    started = start_cluster()
    try:
        yield started
    finally:
        stop_cluster(started)


def tiny_cluster_params(**tracking: object) -> dict:
    """The project's params shrunk: 2 variants, 1 epoch, smallest widths, one CPU per trial."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"].update(hidden=16, ffn=32, layers=1, learned_dim=8, resnet_width=4)
    params["train"].update(epochs=1)
    params["sweep"].update(
        variants=["sa_quadratic_9", "resnet18"], seeds=[0], max_concurrent_trials=2, resources={"cpu": 1, "gpu": 0}
    )
    params["tracking"] = {"experiment": "it-cluster", **tracking}
    return params


@dataclass
class ClusterProject:
    path: Path

    def write_params(self, params: dict) -> None:
        (self.path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    def stage(self, env: dict[str, str], *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", *args], cwd=self.path, env=env, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="session")
def cluster_project(tmp_path_factory: pytest.TempPathFactory) -> ClusterProject:
    """Tracked + not-ignored files of the working tree, committed in a fresh git repo, data prepared."""
    path = copy_project(tmp_path_factory.mktemp("cluster-project"))
    project = ClusterProject(path)
    project.write_params(tiny_cluster_params())
    git = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
    }
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "tiny"]):
        subprocess.run(command, cwd=path, env=git, check=True, capture_output=True)
    started = time.monotonic()
    done = project.stage({**os.environ, "PYTHONPATH": ""}, "stages.prepare", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"prepared the data in {time.monotonic() - started:.1f} s")
    return project


def wait_for_alive_nodes(cluster: LocalCluster, count: int, timeout_s: float = 60) -> None:
    """Until the GCS counts ``count`` alive nodes (it has seen a stopped node go, a started one come)."""
    code = (
        f"from pipeline.sweep.session import check_attachable; import sys; "
        f"sys.exit(check_attachable({cluster.address!r}) != {count})"
    )
    env = cluster.driver_env(RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["python", "-c", code], env=env, capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, f"the cluster still does not have {count} alive nodes"
        time.sleep(1)


def run_tags(db_path: Path) -> dict[str, dict[str, str]]:
    with sqlite3.connect(db_path) as db:
        by_run: dict[str, dict[str, str]] = {}
        for run, key, value in db.execute("SELECT run_uuid, key, value FROM tags"):
            by_run.setdefault(run, {})[key] = value
    return by_run


def epochs_logged(db_path: Path, run_id: str) -> list[int]:
    with sqlite3.connect(db_path) as db:
        return [
            step
            for (step,) in db.execute(
                "SELECT step FROM metrics WHERE run_uuid = ? AND key = 'test_acc' ORDER BY step", (run_id,)
            )
        ]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real SLURM cluster of three one-CPU nodes, each in its own network namespace (``tests/cluster/slurm.py``);
    skipped, naming the missing package or right, where it cannot start (CI installs slurm-wlm and munge: .ci/run)."""
    if missing := slurm_missing():
        pytest.skip(missing)
    started = start_slurm_cluster(node_count=3, cpus=1)
    try:
        yield started
    finally:
        stop_slurm_cluster(started)


@pytest.fixture(scope="session")
def slurm_tracking(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """The lab's tracking server as the SLURM nodes see it: an ``mlflow server`` on the cluster's bridge address
    (every node's namespace reaches it; its sqlite store is read by the tests)."""
    server = MlflowServer(tmp_path_factory.mktemp("slurm-mlflow"), host=slurm_cluster.bridge_ip)
    try:
        server.start()
        yield server
    finally:
        server.stop()
