"""A multi-node Ray cluster on this machine, for the cluster tests and the concurrency benchmark: each node its own
process (``ray_node.py``, Ray's node API) in its own process group, declaring the CPUs and GPUs it is told.

All on 127.0.0.1, token auth on (a token file made here), explicit free ports, a private temp dir (``RAY_TMPDIR``).
Only the nodes' own processes are stopped, never with ``ray stop`` (it stops every Ray on the machine). No pytest
here: ``benchmarks.sweep_concurrency`` starts its nodes with it too (``start_cluster``, ``stop_cluster``).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

NODE_SCRIPT = Path(__file__).with_name("ray_node.py")
VENV_BIN = Path(sys.executable).parent
NODE_START_S = 90
NODE_START_TRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_session(leader: int, descendants: bool = False) -> int:
    """SIGKILL every process of the session ``leader`` started (``start_new_session``: ``ray start`` and its raylet,
    workers, GCS), and with ``descendants`` whatever descends from the leader in another session; the count."""
    import psutil  # Ray's own dependency

    victims = set()
    if descendants:
        root = psutil.Process(leader)
        victims = {root, *root.children(recursive=True)}
    for candidate in psutil.process_iter():
        try:
            if os.getsid(candidate.pid) == leader:
                victims.add(candidate)
        except (ProcessLookupError, PermissionError):
            continue
    for victim in victims:
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
    return len(victims)


@dataclass
class RayNode:
    process: subprocess.Popen
    node_id: str
    log: Path
    dashboard: str  # the head's Jobs API (http://127.0.0.1:PORT)

    def kill(self) -> int:
        """SIGKILL every process of this node, as a machine that dies: its process group, and whatever else descends
        from it or shares its session (a Ray worker in its own group would otherwise keep training); the count."""
        return kill_session(self.process.pid, descendants=True)

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


def start_cluster(cpus: int = 1, worker_cpus: Sequence[int] = (1,)) -> LocalCluster:
    """A head declaring ``cpus`` CPUs and one worker node per entry of ``worker_cpus``, token auth on, in a new
    private temp dir; ``stop_cluster`` stops them and removes it."""
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
        holder.head = holder.start_node("head", str(port), cpus=cpus)
        workers = [holder.start_node("worker", holder.address, cpus=n) for n in worker_cpus]
        holder.worker, holder.extra = (workers[0], workers[1:]) if workers else (None, [])  # type: ignore[assignment]
    except BaseException:
        stop_cluster(holder)
        raise
    return holder


def stop_cluster(cluster: LocalCluster) -> None:
    """Stop the cluster's nodes as they are now (a test may have replaced the worker) and remove its temp dir."""
    try:
        for node in [*cluster.extra, cluster.worker, cluster.head]:
            if node is not None:
                node.stop()
    finally:
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
