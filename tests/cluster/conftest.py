"""A real multi-node Ray cluster on this machine and a copy of the project whose tune stage attaches to it; and a real
SLURM cluster (``slurm_cluster``, ``tests/cluster/slurm.py``) with a tracking server its nodes reach.

The session's cluster has two nodes (a head and a worker) of one CPU each; a module adds nodes of its own (more CPUs,
declared GPUs) with ``LocalCluster.start_node`` and stops them when it is done.

All on 127.0.0.1, token auth on (a token file made here), explicit free ports, a private temp dir (``RAY_TMPDIR``).
Each node is its own process (``ray_node.py``, Ray's node API) in its own process group; only those are stopped,
never with ``ray stop`` (it stops every Ray on the machine). Each node offers one CPU: the machine is small and shared.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from pipeline.sweep.tracking.server import MlflowServer
from tests.cluster.slurm import SlurmCluster, slurm_missing, start_slurm_cluster, stop_slurm_cluster
from tests.project_copy import copy_project

ROOT = Path(__file__).resolve().parents[2]
NODE_SCRIPT = Path(__file__).with_name("ray_node.py")
VENV_BIN = Path(sys.executable).parent
NODE_START_S = 90
NODE_START_TRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayNode:
    process: subprocess.Popen
    node_id: str
    log: Path
    dashboard: str  # the head's Jobs API (http://127.0.0.1:PORT)

    def kill(self) -> int:
        """SIGKILL every process of this node, as a machine that dies: its process group, and whatever else descends
        from it or shares its session (a Ray worker in its own group would otherwise keep training); the count."""
        import psutil  # Ray's own dependency

        root = psutil.Process(self.process.pid)
        victims = {root, *root.children(recursive=True)}
        for candidate in psutil.process_iter():
            try:
                if os.getsid(candidate.pid) == self.process.pid:
                    victims.add(candidate)
            except (ProcessLookupError, PermissionError):
                continue
        for victim in victims:
            try:
                victim.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
        return len(victims)

    def stop(self) -> None:
        """SIGTERM to this node's own process group (the node process stops its Ray processes), then SIGKILL."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class LocalCluster:
    """The session's cluster: a head, a worker (``worker``, replaced by a test that kills it) and the nodes a test or
    module adds (``extra``), all on 127.0.0.1 with token auth."""

    address: str
    token_file: Path
    temp_dir: Path
    node_env: dict[str, str]
    head: RayNode
    worker: RayNode
    extra: list[RayNode] = field(default_factory=list)

    def start_node(
        self,
        role: str,
        where: str,
        prefix: Sequence[str] = (),
        *,
        cpus: int = 1,
        gpus: int = 0,
        env: dict[str, str] | None = None,
    ) -> RayNode:
        """A node process (``ray_node.py``) declaring ``cpus`` CPUs and ``gpus`` GPUs, with ``env`` added to the
        nodes' environment (its Ray workers inherit it); returns once it is up. A node that fails to come up is
        started afresh, up to ``NODE_START_TRIES`` times in all: Ray gives a raylet a fixed 30 s to register with the
        GCS, which a loaded 2-core machine (the other test worker training, a killed node's trials restarting)
        sometimes exceeds."""
        for _ in range(NODE_START_TRIES - 1):
            with contextlib.suppress(RuntimeError):
                return self._start_node_once(role, where, prefix, cpus=cpus, gpus=gpus, env=env)
        return self._start_node_once(role, where, prefix, cpus=cpus, gpus=gpus, env=env)  # the last try raises

    def _start_node_once(
        self, role: str, where: str, prefix: Sequence[str], *, cpus: int, gpus: int, env: dict[str, str] | None
    ) -> RayNode:
        log = self.temp_dir / f"node-{len(list(self.temp_dir.glob('node-*.log')))}.log"
        ports = [str(free_port()) for _ in range(3)]  # agent, metrics, dashboard (the head serves the Jobs API there)
        command = [*prefix, sys.executable, str(NODE_SCRIPT), role, where, *ports, str(cpus), str(gpus)]
        # Each node its own Ray temp dir, as on separate machines: nodes sharing one would share its session folder,
        # and a worker node's clean-up of a job's unpacked working_dir would delete the head's copy too.
        node_dir = self.temp_dir / f"n{len(list(self.temp_dir.glob('node-*.log')))}" if role == "worker" else None
        env = {**self.node_env, **(env or {})}
        if node_dir:
            env["RAY_TMPDIR"] = str(node_dir)
        if node_dir:
            node_dir.mkdir()
        with log.open("w") as err:
            process = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
            )
        node = RayNode(process, "", log, f"http://127.0.0.1:{ports[2]}")
        ready, _, _ = select.select([process.stdout], [], [], NODE_START_S)
        line = process.stdout.readline() if ready else ""
        if not line.startswith("READY"):
            node.stop()
            with contextlib.suppress(ProcessLookupError):  # a raylet or GCS the failed node process left behind
                os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError(f"ray node ({role}) did not start: {line!r}\n{log.read_text()[-3000:]}")
        node.node_id = line.split()[2]
        return node

    def driver_env(self, **changes: str | None) -> dict[str, str]:
        """A driver's environment: the cluster's address and token file, nothing else of Ray's set up for it (no
        RAY_AUTH_MODE, no loopback variable: the stage sets them); ``changes`` set or (None) remove variables."""
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
            "RAY_ADDRESS": self.address,
            "RAY_AUTH_TOKEN_PATH": str(self.token_file),
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "PYTHONPATH", "RAY_TMPDIR"):
            env.pop(key, None)
        for key, value in changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    # Short path: Ray's unix sockets live under RAY_TMPDIR (107-character limit).
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    token_file = temp_dir / "auth_token"
    token_file.write_text(os.urandom(24).hex())
    node_env = {
        **os.environ,
        "RAY_TMPDIR": str(temp_dir),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # A cluster's nodes have the project's dependencies: a submitted job's `python` is this venv's
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
    }
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        node_env.pop(key, None)
    port = free_port()
    holder = LocalCluster(f"127.0.0.1:{port}", token_file, temp_dir, node_env, None, None)  # type: ignore[arg-type]
    try:
        holder.head = holder.start_node("head", str(port))
        holder.worker = holder.start_node("worker", holder.address)
        yield holder
    finally:  # the nodes as they are now: a test may have replaced the worker
        for node in [*holder.extra, holder.worker, holder.head]:
            if node is not None:
                node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


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
