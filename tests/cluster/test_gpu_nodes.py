"""Many GPU nodes, simulated, and a node drained with notice (a spot preemption), on the session's cluster.

Four worker nodes of 2 declared GPUs each join the session's cluster for this module. Ray counts declared GPUs and
sets each trial's ``CUDA_VISIBLE_DEVICES``; torch finds no CUDA here, so trials train on the CPU
(``sweep.resources.cpu_fallback``). The nodes' workers load ``paced_batches/sitecustomize.py`` (test-only): a sleep
per batch gives a tiny model paper-like epoch times, and every batch a trial trains is logged with its node, so the
tests count the work each trial did, redid or lost.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cluster.conftest import (
    ClusterProject,
    LocalCluster,
    RayNode,
    epochs_logged,
    run_tags,
    tiny_cluster_params,
    wait_for_alive_nodes,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
PACED = Path(__file__).with_name("paced_batches")
GPU_NODES, GPUS_PER_NODE = 4, 2
SLEEP_S = 0.3  # per batch: with the digits' 23 batches of 64, a 7 s epoch
DRAIN_SLEEP_S = 0.5  # a 12 s epoch: the notice lands mid-epoch whatever the machine's load


@dataclass
class Batch:
    trial: str
    node: str
    noticed: bool  # the drain notice was seen before this batch: it was not trained
    at: float  # time.time() after the batch


@dataclass
class GpuNodes:
    cluster: LocalCluster
    settings: Path
    log: Path
    nodes: list[RayNode] = field(default_factory=list)

    def start(self) -> RayNode:
        env = {"PYTHONPATH": str(PACED), "PACED_BATCHES": str(self.settings)}
        node = self.cluster.start_node("worker", self.cluster.address, cpus=2, gpus=GPUS_PER_NODE, env=env)
        self.nodes.append(node)
        self.cluster.extra.append(node)
        return node

    def replace(self, node: RayNode) -> None:
        """A new node for one a test took away (tests run in any order: each finds four)."""
        self.nodes.remove(node)
        self.cluster.extra.remove(node)
        node.stop()
        self.start()

    def pace(self, **settings: object) -> None:
        """Settings for the next sweep's trials (``paced_batches``), with an empty batch log."""
        self.log.write_text("")
        self.settings.write_text(json.dumps({"sleep_s": SLEEP_S, "log": str(self.log)} | settings))

    def batches(self) -> list[Batch]:
        lines = [line.split() for line in self.log.read_text().splitlines() if line.startswith("batch ")]
        return [Batch(trial, node, noticed == "1", float(at)) for _, trial, node, noticed, at in lines]


@pytest.fixture(scope="module")
def gpu_nodes(cluster: LocalCluster) -> Iterator[GpuNodes]:
    folder = cluster.temp_dir / "paced"
    folder.mkdir()
    paced = GpuNodes(cluster, folder / "settings.json", folder / "batches.log")
    paced.pace()
    try:
        for _ in range(GPU_NODES):
            paced.start()
        yield paced
    finally:
        for node in paced.nodes:
            node.stop()
            cluster.extra.remove(node)
        wait_for_alive_nodes(cluster, 2, timeout_s=120)  # the other modules expect the session's two nodes


def gpu_params(
    experiment: str, seeds: list[int], *, epochs: int, max_failures: int, checkpoint_interval_s: float = 0
) -> dict:
    params = tiny_cluster_params(sqlite_on_cluster=True, system_metrics=False)
    params["tracking"]["experiment"] = experiment
    params["train"]["epochs"] = epochs
    params["sweep"].update(
        variants=["sa_quadratic_9"],
        seeds=seeds,
        max_concurrent_trials=len(seeds),
        max_failures=max_failures,
        checkpoint_interval_s=checkpoint_interval_s,
        resources={"cpu": 0.25, "gpu": 0.5, "cpu_fallback": True},
    )
    return params


def params_batch_size(project: ClusterProject) -> int:
    import yaml

    return yaml.safe_load((project.path / "params.yaml").read_text())["train"]["batch_size"]


def start_stage(cluster: LocalCluster, project: ClusterProject) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stages.tune"],
        cwd=project.path,
        env=cluster.driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_until(stage: subprocess.Popen, what: str, ready: object, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        if stage.poll() is not None or time.monotonic() > deadline:
            stage.kill()
            output, _ = stage.communicate()
            pytest.fail(f"{what}: never happened\n{output[-6000:]}")
        time.sleep(0.5)


def finish(stage: subprocess.Popen, timeout_s: float = 400) -> str:
    output, _ = stage.communicate(timeout=timeout_s)
    assert stage.returncode == 0, output[-8000:]
    return output


def children(project: ClusterProject) -> tuple[dict, dict[str, dict[str, str]]]:
    """The manifest and the tags of each of its trials' runs under the sweep's parent run."""
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    runs = run_tags(project.path / "mlflow.db")
    return manifest, {r: t for r, t in runs.items() if t.get("mlflow.parentRunId") == manifest["parent_run_id"]}


def batches_per_epoch(db_path: Path, run_id: str, batch_size: int) -> int:
    """From the run's own metrics: training images (images per second x seconds of an epoch) over the batch size."""
    with sqlite3.connect(db_path) as db:
        (images,) = db.execute(
            "SELECT a.value * b.value FROM metrics a JOIN metrics b ON a.run_uuid = b.run_uuid AND a.step = b.step "
            "WHERE a.run_uuid = ? AND a.key = 'images_per_s' AND b.key = 'epoch_time_s' AND a.step = 1",
            (run_id,),
        ).fetchone()
    return math.ceil(round(images) / batch_size)


def tags_so_far(db_path: Path) -> dict[str, dict[str, str]]:
    """``run_tags`` while the stage may still be creating the store (no file, no tables yet: nothing so far)."""
    try:
        return run_tags(db_path) if db_path.exists() else {}
    except sqlite3.OperationalError:
        return {}


def running_runs(db_path: Path) -> list[str]:
    with sqlite3.connect(db_path) as db:
        return [run for (run,) in db.execute("SELECT run_uuid FROM runs WHERE status = 'RUNNING'")]


def test_sixteen_trials_share_eight_gpus_and_a_lost_node_moves_its_trials(
    cluster: LocalCluster, cluster_project: ClusterProject, gpu_nodes: GpuNodes
) -> None:
    """``sweep.resources.gpu: 0.5`` on 4 nodes x 2 GPUs: 16 trials train at once, two per (node, GPU), each seeing its
    GPU in CUDA_VISIBLE_DEVICES; a node killed mid-sweep moves its trials to the others, each resuming from its last
    epoch checkpoint into its own MLflow run."""
    trials, epochs = 16, 2
    seeds = {str(seed) for seed in range(trials)}
    cluster_project.write_params(gpu_params("it-gpu-nodes", list(range(trials)), epochs=epochs, max_failures=1))
    gpu_nodes.pace(start_together=trials)  # no trial trains before all 16 run: only Ray's packing lets them start
    db = cluster_project.path / "mlflow.db"
    started = time.monotonic()
    stage = start_stage(cluster, cluster_project)
    victim = gpu_nodes.nodes[-1]
    try:

        def this_sweeps_runs() -> dict[str, dict[str, str]]:  # the store holds the module's other runs
            return {r: t for r, t in tags_so_far(db).items() if t.get("seed") in seeds and "ray.gpu_ids" in t}

        def all_trained_an_epoch() -> bool:
            placed = this_sweeps_runs()
            return len(placed) == trials and all(epochs_logged(db, r) for r in placed)

        wait_until(stage, "16 trials each logging an epoch", all_trained_an_epoch)
        placed = this_sweeps_runs()
        killed = victim.kill()
        finish(stage)
    finally:
        if stage.poll() is None:
            stage.kill()
        cluster_project.write_params(tiny_cluster_params())
        gpu_nodes.replace(victim)
    seconds = time.monotonic() - started

    # Packing: each (node, GPU) slot held by exactly two trials, the GPU Ray gave each one is the one it sees.
    slots = Counter((t["ray.node_id"], t["ray.gpu_ids"]) for t in placed.values())
    assert sorted(slots.values()) == [2] * (GPU_NODES * GPUS_PER_NODE), slots
    assert {gpu for _, gpu in slots} == {str(g) for g in range(GPUS_PER_NODE)}
    assert all(t["cuda_visible_devices"] == t["ray.gpu_ids"] for t in placed.values())
    # Concurrency: every trial trained its first batch before any trial trained its last (before the kill).
    batches = gpu_nodes.batches()
    by_trial: dict[str, list[Batch]] = {}
    for batch in batches:
        by_trial.setdefault(batch.trial, []).append(batch)
    assert len(by_trial) == trials
    assert max(b[0].at for b in by_trial.values()) < min(b[-1].at for b in by_trial.values())

    # The lost node's trials: finished elsewhere, each in its own run, every epoch logged once.
    manifest, runs = children(cluster_project)
    assert {t["status"] for t in manifest["trials"]} == {"finished"} and len(manifest["trials"]) == trials
    assert set(runs) == {t["run_id"] for t in manifest["trials"]}  # one run per trial identity: no duplicate
    assert running_runs(db) == []  # no orphan left RUNNING
    moved = {r for r, t in placed.items() if t["ray.node_id"] == victim.node_id}
    assert len(moved) == 2 * GPUS_PER_NODE
    for run in moved:
        assert runs[run]["ray.node_ids"].split(",")[0] == victim.node_id
        assert runs[run]["ray.node_id"] not in (victim.node_id, cluster.head.node_id, cluster.worker.node_id)
        assert epochs_logged(db, run) == list(range(1, epochs + 1))
    for run in set(runs) - moved:
        assert runs[run]["ray.node_ids"] == runs[run]["ray.node_id"] != victim.node_id
    # From the last checkpoint: a moved trial redid less than an epoch (the batches since its last epoch).
    per_epoch = batches_per_epoch(db, next(iter(runs)), params_batch_size(cluster_project))
    moved_trials = {runs[r]["ray.trial_id"] for r in moved}
    assert {len(b) for t, b in by_trial.items() if t not in moved_trials} == {epochs * per_epoch}
    redone = [len(by_trial[t]) - epochs * per_epoch for t in moved_trials]
    assert all(0 <= n < per_epoch for n in redone), redone
    print(
        f"16 trials on {GPU_NODES} nodes x {GPUS_PER_NODE} GPUs in {seconds:.0f} s; killed {killed} processes of a "
        f"node; its {len(moved)} trials moved and redid {redone} batches of {per_epoch} per epoch"
    )


def drain(cluster: LocalCluster, node: RayNode, notice_s: int) -> float:
    """What an autoscaler does on a spot notice: drain the node for preemption with a deadline (the call behind
    ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds``, made here without the
    CLI's seconds of start-up); returns when GCS accepted it (time.time())."""
    code = (
        "import sys, time, ray._raylet\n"
        "from ray.core.generated import autoscaler_pb2\n"
        "address, node, notice_s = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "client = ray._raylet.GcsClient(address=address)\n"
        "reason = autoscaler_pb2.DrainNodeReason.Value('DRAIN_NODE_REASON_PREEMPTION')\n"
        "deadline_ms = int(time.time() * 1000) + notice_s * 1000\n"
        "accepted, why = client.drain_node(node, reason, 'spot instance preempted', deadline_ms)\n"
        "print(accepted, time.time(), why)\n"
    )
    env = cluster.driver_env(RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    command = [sys.executable, "-c", code, cluster.address, node.node_id, str(notice_s)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    accepted, at, *why = done.stdout.split()
    assert done.returncode == 0 and accepted == "True", f"{done.stdout}\n{done.stderr[-3000:]}"
    return float(at)


@pytest.mark.parametrize("interval_s", [0, 60])
def test_a_drained_node_costs_seconds_not_an_epoch(
    cluster: LocalCluster, cluster_project: ClusterProject, gpu_nodes: GpuNodes, interval_s: int
) -> None:
    """A node drained with 5 s notice mid-epoch, then killed at the deadline: its trial checkpoints at the next batch,
    continues on another node from that batch, and finishes with ``max_failures: 0`` (the preemption is no failure),
    redoing no batch; a retry from the last epoch would redo every batch of the epoch so far. At
    ``sweep.checkpoint_interval_s: 60`` Tune holds no checkpoint of epoch 1 (reported without one), so the drain's is
    the only state to resume from: the retry from Tune's would redo the whole of epoch 1 as well. A node that dies
    on its own before the drain (on a loaded machine its raylet can miss heartbeats, or fate-share with a failed
    dashboard agent) fails the trial before any preemption: that attempt says nothing, and the test starts over once,
    with another seed."""
    epochs, notice_s = 2, 5
    for seed in (100 + 2 * interval_s, 101 + 2 * interval_s):  # a trial identity of its own per interval
        started = time.monotonic()  # this attempt's sweep
        drained = _drain_mid_epoch(cluster, cluster_project, gpu_nodes, seed, epochs, notice_s, interval_s)
        if drained is not None:
            break
    else:
        pytest.fail("twice the trial's node died on its own before the test drained it")
    node, drained_at = drained
    db = cluster_project.path / "mlflow.db"
    seconds = time.monotonic() - started

    manifest, runs = children(cluster_project)
    assert [t["status"] for t in manifest["trials"]] == ["finished"]
    (run,) = runs
    assert runs[run]["ray.node_ids"].split(",") == [node.node_id, runs[run]["ray.node_id"]]
    assert epochs_logged(db, run) == [1, 2]
    batches = gpu_nodes.batches()
    trained = [b for b in batches if not b.noticed]
    on_drained = [b for b in trained if b.node == node.node_id]
    notice = next(b for b in batches if b.noticed)
    assert notice.at > drained_at  # the checkpoint came after the notice, at the next batch boundary
    # Every batch trained once: the moved trial went on from the batch its drain checkpoint was taken at.
    per_epoch = batches_per_epoch(db, run, params_batch_size(cluster_project))
    redone = len(trained) - epochs * per_epoch
    assert redone == 0, f"{len(trained)} batches trained for {epochs} epochs of {per_epoch}"
    trial_path = Path(runs[run]["ray.trial_path"])
    marker = json.loads((trial_path / "drain_checkpoint.json").read_text())
    assert marker["epoch"] == 1 and marker["steps"] == len(on_drained) - per_epoch > 0
    # Tune's checkpoints: one per epoch at interval 0; at 60 only the last epoch's (taken after the retry).
    tune_checkpoints = sorted(p.name for p in trial_path.glob("checkpoint_*"))
    assert len(tune_checkpoints) == (epochs if interval_s == 0 else 1), tune_checkpoints
    batch_s = (on_drained[-1].at - on_drained[0].at) / (len(on_drained) - 1)  # as trained, sleep and compute
    epoch_s = per_epoch * batch_s
    lost = redone / per_epoch  # training lost: the batches trained twice
    assert lost < 0.1, f"lost {lost:.0%} of an epoch"
    resumed = next(b for b in trained if b.at > notice.at)  # the retry's first batch, on another node
    assert resumed.node != node.node_id
    without = marker["steps"] + (per_epoch if interval_s else 0)  # what a retry from Tune's checkpoint redoes
    print(
        f"interval {interval_s} s: sweep of {seconds:.0f} s; drained with {notice_s} s notice: checkpoint "
        f"{notice.at - drained_at:.1f} s after the notice, at batch {marker['steps']} of {per_epoch} of epoch 2 "
        f"({epoch_s:.1f} s epochs); lost {lost:.1%} of an epoch ({redone} batches redone), trained again "
        f"{resumed.at - notice.at:.1f} s after the checkpoint (the deadline, then the retry's start); a retry from "
        f"Tune's checkpoint would redo {without} batches ({without / per_epoch:.0%} of an epoch, "
        f"{without * batch_s:.1f} s)"
    )


def _drain_mid_epoch(
    cluster: LocalCluster,
    cluster_project: ClusterProject,
    gpu_nodes: GpuNodes,
    seed: int,
    epochs: int,
    notice_s: int,
    interval_s: int,
) -> tuple[RayNode, float] | None:
    """One sweep of one trial whose node is drained a few batches into epoch 2 and killed at the deadline: the node and
    when the drain was accepted; None when a node died on its own before the drain (replaced, the stage stopped)."""
    params = gpu_params("it-gpu-drain", [seed], epochs=epochs, max_failures=0, checkpoint_interval_s=interval_s)
    cluster_project.write_params(params)
    gpu_nodes.pace(sleep_s=DRAIN_SLEEP_S)
    db = cluster_project.path / "mlflow.db"
    stage, node, drained_at = start_stage(cluster, cluster_project), None, 0.0
    try:

        def placed() -> dict[str, str] | None:  # this sweep's trial (the store holds the module's other runs)
            runs = {r: t for r, t in tags_so_far(db).items() if t.get("seed") == str(seed) and "ray.gpu_ids" in t}
            return next((t for r, t in runs.items() if epochs_logged(db, r)), None)

        try:
            wait_until(stage, "the trial logging its first epoch", placed)
            tags = placed()
            first = len(gpu_nodes.batches())  # epoch 1's batches (and maybe one or two of epoch 2's)
            wait_until(stage, "a few batches of epoch 2", lambda: len(gpu_nodes.batches()) >= first + 3)
        except pytest.fail.Exception:
            if not replace_lost(gpu_nodes):
                raise
            return None
        if replace_lost(gpu_nodes):  # a trial on a dead node trains on until Ray notices: no preemption to measure
            return None
        node = next(n for n in gpu_nodes.nodes if n.node_id == tags["ray.node_id"])
        drained_at = drain(cluster, node, notice_s)
        time.sleep(max(0.0, drained_at + notice_s - time.time()))
        node.kill()  # the provider takes the node at the deadline
        finish(stage)
    finally:
        if stage.poll() is None:
            stage.kill()
        cluster_project.write_params(tiny_cluster_params())
        if node is not None:
            gpu_nodes.replace(node)
    return node, drained_at


def replace_lost(gpu_nodes: GpuNodes) -> list[RayNode]:
    """The nodes that died on their own (their raylet is gone), each replaced by a new one."""
    import psutil  # Ray's own dependency

    def alive(node: RayNode) -> bool:
        try:
            children = psutil.Process(node.process.pid).children(recursive=True)
            return any(c.name() == "raylet" and c.status() != psutil.STATUS_ZOMBIE for c in children)
        except psutil.NoSuchProcess:
            return False

    lost = [node for node in gpu_nodes.nodes if not alive(node)]
    for node in lost:
        gpu_nodes.replace(node)
    return lost
