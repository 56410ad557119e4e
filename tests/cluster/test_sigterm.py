"""SIGTERM to a node started as ``ray start --block``, alone (what Kubernetes does to a pod's PID 1, systemd to a
unit, a plain ``kill``): Ray 2.60's own handler drains the node for preemption for
``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` before it stops the node's processes, so its trial checkpoints mid-epoch
and continues on another node from that batch: no training lost. Ray then stops the raylet with SIGTERM and
reports the trial's death as an expected termination ("received SIGTERM"), not as the preemption the drain
announced; the driver counts it as no failure all the same (``pipeline.sweep.worker_deaths``).

``ray start --address`` refuses a second node on one machine while Ray is kept on the loopback interface, so this
module's cluster lives on a network of its own: a bridge, and one network namespace per node joined to it by a veth
pair, each with an address of its own (10.231.<n>.<k>: the test's own hosts). Head and driver share one namespace;
two workers declare a GPU each, so the trial (``gpu: 1``) trains on a worker. Every node is a real ``ray start
--block`` with token auth; the workers load ``paced_batches/sitecustomize.py`` (test-only) to log every batch. Needs
root (``ip netns``); the namespaces, links and processes made here are removed by name and process id.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cluster.conftest import VENV_BIN, ClusterProject, epochs_logged, tiny_cluster_params
from tests.cluster.local_cluster import kill_session
from tests.cluster.test_gpu_nodes import (
    batches_per_epoch,
    children,
    gpu_params,
    params_batch_size,
    tags_so_far,
    wait_until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
PACED = Path(__file__).with_name("paced_batches")
DRAIN_TIMEOUT_S = 8  # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S on the workers (Ray's default: 30)
SLEEP_S = 0.5  # per batch: 12 s epochs, so the SIGTERM lands mid-epoch
GCS_PORT = 6379  # each node has its own network namespace: Ray's default ports collide with nothing


def sh(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


@dataclass
class Node:
    name: str  # its network namespace
    ip: str
    process: subprocess.Popen | None = None
    node_id: str = ""

    def stop(self) -> None:
        """SIGKILL ``ray start`` and every process of its session (its raylet, workers, GCS)."""
        if self.process is None:
            return
        kill_session(self.process.pid)
        self.process.wait(timeout=30)


@dataclass
class NamespacedCluster:
    folder: Path
    token_file: Path
    bridge: str
    head: Node
    workers: list[Node]
    env: dict[str, str] = field(default_factory=dict)
    settings: Path = Path()
    log: Path = Path()

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    def in_ns(self, node: Node, *command: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{node.name}", *command]

    def start(self, node: Node, *args: str, env: dict[str, str] | None = None) -> None:
        command = self.in_ns(node, str(VENV_BIN / "ray"), "start", "--block", "--node-ip-address", node.ip, *args)
        command += ["--temp-dir", str(self.folder / node.name), "--object-store-memory", str(150 * 1024**2)]
        with (self.folder / f"{node.name}.log").open("w") as out:
            node.process = subprocess.Popen(
                command, env={**self.env, **(env or {})}, stdout=out, stderr=out, start_new_session=True
            )

    def alive(self) -> dict[str, str]:
        """node IP -> node id of every alive node, asked from the head's namespace."""
        code = (
            "import json, sys, ray\n"
            "ray.init(address=sys.argv[1], log_to_driver=False)\n"
            "print(json.dumps({n['NodeManagerAddress']: n['NodeID'] for n in ray.nodes() if n['Alive']}))\n"
        )
        done = subprocess.run(
            self.in_ns(self.head, sys.executable, "-c", code, self.address),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def namespaced() -> Iterator[NamespacedCluster]:
    if os.geteuid() != 0 or shutil.which("nsenter") is None or shutil.which("ip") is None:
        pytest.skip("needs root, ip(8) and nsenter(1): one network namespace per node")
    tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
    subnet = f"10.231.{random.randrange(1, 255)}"
    folder = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))  # short: Ray's unix sockets live under it
    token_file = folder / "auth_token"
    token_file.write_text(os.urandom(24).hex())
    nodes = [Node(f"rs{tag}{k}", f"{subnet}.{k + 1}") for k in range(3)]
    cluster = NamespacedCluster(folder, token_file, f"rsb{tag}", nodes[0], nodes[1:])
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_TMPDIR", "PYTHONPATH"):
        env.pop(key, None)
    cluster.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    cluster.env["RAY_USAGE_STATS_ENABLED"] = "0"
    cluster.settings, cluster.log = folder / "paced.json", folder / "batches.log"
    made: list[Node] = []
    try:
        sh("ip", "link", "add", cluster.bridge, "type", "bridge")
        sh("ip", "link", "set", cluster.bridge, "up")
        for node in nodes:
            sh("ip", "netns", "add", node.name)
            made.append(node)
            host, inside = f"{node.name}h", f"{node.name}n"
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", node.name)
            sh("ip", "link", "set", host, "master", cluster.bridge, "up")
            for step in (
                ["ip", "addr", "add", f"{node.ip}/24", "dev", inside],
                ["ip", "link", "set", inside, "up"],
                ["ip", "link", "set", "lo", "up"],
            ):
                sh("nsenter", f"--net=/run/netns/{node.name}", *step)
        cluster.log.write_text("")
        cluster.settings.write_text(json.dumps({"sleep_s": SLEEP_S, "log": str(cluster.log)}))
        head = ["--head", "--port", str(GCS_PORT), "--num-cpus", "1", "--num-gpus", "0", "--include-dashboard", "false"]
        cluster.start(cluster.head, *head)
        worker_env = {
            "PYTHONPATH": str(PACED),
            "PACED_BATCHES": str(cluster.settings),
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S),
        }
        wait_for_nodes(cluster, 1)
        for worker in cluster.workers:
            cluster.start(worker, "--address", cluster.address, "--num-cpus", "1", "--num-gpus", "1", env=worker_env)
        ids = wait_for_nodes(cluster, 3)
        for node in nodes:
            node.node_id = ids[node.ip]
        yield cluster
    finally:
        for node in nodes:
            node.stop()
        for node in made:
            subprocess.run(["ip", "netns", "del", node.name], capture_output=True)
            subprocess.run(["ip", "link", "del", f"{node.name}h"], capture_output=True)
        subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def wait_for_nodes(cluster: NamespacedCluster, count: int, timeout_s: float = 120) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ids = cluster.alive()
        except (AssertionError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
            ids = {}
        if len(ids) >= count:
            return ids
        logs = "\n".join(p.read_text()[-1500:] for p in sorted(cluster.folder.glob("*.log")))
        assert time.monotonic() < deadline, f"{len(ids)} of {count} nodes alive\n{logs}"
        time.sleep(2)


def test_sigterm_to_ray_start_block_drains_and_costs_no_epoch(
    namespaced: NamespacedCluster, cluster_project: ClusterProject
) -> None:
    """A trial a few batches into epoch 2 when its node's ``ray start --block`` gets SIGTERM: Ray's handler drains the
    node (preemption, a deadline ``DRAIN_TIMEOUT_S`` ahead), the trial checkpoints at the next batch, the handler
    stops the node at the timeout, and the trial finishes on the other worker from that batch, every batch trained
    once, every epoch logged once, with ``sweep.max_failures: 0`` (the preemption is no failure)."""
    cluster, epochs, seed = namespaced, 2, 300
    params = gpu_params("it-sigterm", [seed], epochs=epochs, max_failures=0)
    params["sweep"]["resources"] = {"cpu": 1, "gpu": 1, "cpu_fallback": True}
    cluster_project.write_params(params)
    db = cluster_project.path / "mlflow.db"
    env = {**cluster.env, "RAY_ADDRESS": cluster.address, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("RAY_AUTH_MODE")  # the stage sets it, as for a user
    started = time.monotonic()
    stage = subprocess.Popen(
        cluster.in_ns(cluster.head, sys.executable, "-m", "stages.tune"),
        cwd=cluster_project.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def placed() -> dict[str, str] | None:
            runs = {r: t for r, t in tags_so_far(db).items() if t.get("seed") == str(seed) and "ray.gpu_ids" in t}
            return next((t for r, t in runs.items() if epochs_logged(db, r)), None)

        def batches() -> list[list[str]]:
            return [line.split() for line in cluster.log.read_text().splitlines() if line.startswith("batch ")]

        wait_until(stage, "the trial logging its first epoch", placed, timeout_s=400)
        first = len(batches())
        wait_until(stage, "a few batches of epoch 2", lambda: len(batches()) >= first + 3)
        victim = next(w for w in cluster.workers if w.node_id == placed()["ray.node_id"])
        sigterm_at = time.time()
        victim.process.send_signal(signal.SIGTERM)  # to `ray start` alone, as Kubernetes does
        victim.process.wait(timeout=DRAIN_TIMEOUT_S + 30)
        ended_after = time.time() - sigterm_at
        output, _ = stage.communicate(timeout=400)
        assert stage.returncode == 0, output[-8000:]
    finally:
        if stage.poll() is None:
            stage.kill()
        cluster_project.write_params(tiny_cluster_params())
    seconds = time.monotonic() - started

    manifest, runs = children(cluster_project)
    assert [t["status"] for t in manifest["trials"]] == ["finished"]
    (run,) = runs
    other = next(w for w in cluster.workers if w is not victim)
    assert runs[run]["ray.node_ids"].split(",") == [victim.node_id, other.node_id]
    assert epochs_logged(db, run) == [1, 2]
    assert DRAIN_TIMEOUT_S - 1 < ended_after < DRAIN_TIMEOUT_S + 15  # Ray's handler drained, then stopped the node
    lines = batches()
    trained = [line for line in lines if line[3] == "0"]
    notice = next(line for line in lines if line[3] == "1")
    per_epoch = batches_per_epoch(db, run, params_batch_size(cluster_project))
    redone = len(trained) - epochs * per_epoch
    assert redone == 0, f"{len(trained)} batches trained for {epochs} epochs of {per_epoch}"
    marker = json.loads(Path(runs[run]["ray.trial_path"], "drain_checkpoint.json").read_text())
    on_victim = [line for line in trained if line[2] == victim.node_id]
    assert marker["epoch"] == 1 and marker["steps"] == len(on_victim) - per_epoch > 0
    resumed = next(float(line[4]) for line in trained if line[2] == other.node_id)
    print(
        f"sweep of {seconds:.0f} s; SIGTERM to ray start --block: checkpoint {float(notice[4]) - sigterm_at:.1f} s "
        f"after it, at batch {marker['steps']} of {per_epoch} of epoch 2; the node ended {ended_after:.1f} s after "
        f"the signal (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S={DRAIN_TIMEOUT_S}); trained again on the other node "
        f"{resumed - sigterm_at:.1f} s after the signal; lost {redone / per_epoch:.1%} of an epoch ({redone} batches)"
    )
