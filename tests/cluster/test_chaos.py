"""Worker nodes killed at random through a whole sweep, as Ray's own release test of Tune's fault tolerance does:
unlimited retries (``sweep.max_failures: -1``), the Ray results in a bucket (an S3-compatible server on 127.0.0.1),
each killed node replaced by a new one so the capacity remains.

Three worker nodes of one declared GPU each join the session's cluster; trials ask for half a GPU, so only these
nodes train (the session's head and worker, never killed, have none) and every kill costs trials. The nodes' workers
load ``paced_batches/sitecustomize.py`` (test-only): a sleep per batch stretches the sweep over the kills, and every
batch a trial trains is logged, so the test counts the work each trial redid.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cluster.conftest import (
    ClusterProject,
    LocalCluster,
    RayNode,
    epochs_logged,
    tiny_cluster_params,
    wait_for_alive_nodes,
)
from tests.cluster.test_gpu_nodes import (
    batches_per_epoch,
    children,
    finish,
    gpu_params,
    params_batch_size,
    running_runs,
    start_stage,
    tags_so_far,
    wait_until,
)

if TYPE_CHECKING:
    from tests.conftest import Bucket

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
PACED = Path(__file__).with_name("paced_batches")
NODES = 3
TRIALS, EPOCHS = 8, 3
SLEEP_S = 0.15  # per batch: with the digits' 23 batches of 64, epochs of a few seconds
KILLS, MIN_KILLS = 4, 3  # kills tried; the least that must take trials down before the sweep ends
KILL_GAP_S = (3.0, 12.0)  # from one kill (or the first logged epoch) to the next: a random moment in this range


@dataclass
class ChaosNodes:
    cluster: LocalCluster
    settings: Path
    log: Path
    nodes: list[RayNode] = field(default_factory=list)

    def start(self) -> RayNode:
        env = {"PYTHONPATH": str(PACED), "PACED_BATCHES": str(self.settings)}
        node = self.cluster.start_node("worker", self.cluster.address, cpus=1, gpus=1, env=env)
        self.nodes.append(node)
        self.cluster.extra.append(node)
        return node

    def busy(self, within_s: float) -> list[RayNode]:
        """The nodes that trained a batch in the last ``within_s`` seconds: a kill there takes trials down."""
        now, trained = time.time(), set()
        for line in self.log.read_text().splitlines():
            if line.startswith("batch ") and now - float(line.split()[4]) < within_s:
                trained.add(line.split()[2])
        return [node for node in self.nodes if node.node_id in trained]

    def kill_and_replace(self, node: RayNode) -> None:
        """The machine dies (SIGKILL of all its processes); a new one joins in its place."""
        node.kill()
        self.nodes.remove(node)
        self.cluster.extra.remove(node)
        node.stop()
        self.start()


@pytest.fixture
def chaos_nodes(cluster: LocalCluster) -> Iterator[ChaosNodes]:
    folder = cluster.temp_dir / "chaos"
    folder.mkdir(exist_ok=True)
    nodes = ChaosNodes(cluster, folder / "settings.json", folder / "batches.log")
    nodes.log.write_text("")
    nodes.settings.write_text(json.dumps({"sleep_s": SLEEP_S, "log": str(nodes.log)}))
    try:
        for _ in range(NODES):
            nodes.start()
        yield nodes
    finally:
        for node in nodes.nodes:
            node.stop()
            cluster.extra.remove(node)
        wait_for_alive_nodes(cluster, 2, timeout_s=120)  # the other tests expect the session's two nodes


def test_chaos_random_node_kills_through_a_whole_sweep(
    cluster: LocalCluster, cluster_project: ClusterProject, chaos_nodes: ChaosNodes, bucket: Bucket
) -> None:
    """8 trials of 3 epochs; after the first logged epoch, 4 times, a random node among those training is killed at a
    random moment 3-12 s after the last kill and replaced (at least 3 of the kills must take trials down before the
    sweep ends). Unbounded kills would livelock on this small machine: a retry restarting (tens of seconds here)
    would be killed again before it trains. Every trial finishes all its epochs, each epoch logged once in its one
    MLflow run, no run left RUNNING, and no trial redoes more than an epoch per retry (what follows its last
    checkpoint)."""
    seed = random.randrange(2**32)
    chance = random.Random(seed)
    print(f"chaos seed {seed}")
    params = gpu_params("it-chaos", list(range(200, 200 + TRIALS)), epochs=EPOCHS, max_failures=-1)
    params["sweep"].update(max_concurrent_trials=4, storage_path=bucket.uri("ray"))
    cluster_project.write_params(params)
    db = cluster_project.path / "mlflow.db"
    seeds = {str(s) for s in params["sweep"]["seeds"]}
    started, started_at = time.monotonic(), time.time()
    stage = start_stage(cluster, cluster_project)
    kills: list[tuple[str, float]] = []  # (node id, time.time())
    try:

        def an_epoch_logged() -> bool:
            runs = {r for r, t in tags_so_far(db).items() if t.get("seed") in seeds and "ray.gpu_ids" in t}
            return any(epochs_logged(db, r) for r in runs)

        wait_until(stage, "a first epoch logged", an_epoch_logged)
        for _ in range(KILLS):  # each at a random moment, on a random node among those training then
            moment, busy = time.monotonic() + chance.uniform(*KILL_GAP_S), []
            while stage.poll() is None and (time.monotonic() < moment or not (busy := chaos_nodes.busy(within_s=2.0))):
                time.sleep(0.2)
            if stage.poll() is not None:
                break
            victim = chance.choice(busy)
            kills.append((victim.node_id, time.time()))
            chaos_nodes.kill_and_replace(victim)
        finish(stage)
    finally:
        if stage.poll() is None:
            stage.kill()
        cluster_project.write_params(tiny_cluster_params())
    seconds = time.monotonic() - started
    assert len(kills) >= MIN_KILLS, f"the sweep ended after {len(kills)} kills ({seconds:.0f} s): {kills}"

    manifest, runs = children(cluster_project)
    assert len(manifest["trials"]) == TRIALS and {t["status"] for t in manifest["trials"]} == {"finished"}
    assert set(runs) == {t["run_id"] for t in manifest["trials"]}  # one run per trial: no duplicate
    assert running_runs(db) == []  # nothing left RUNNING
    for run in runs:
        assert epochs_logged(db, run) == list(range(1, EPOCHS + 1)), runs[run]  # each epoch once
    # Work lost: a retry redoes at most what followed the trial's last checkpoint (less than an epoch, or one whole
    # epoch when the kill came between its last batch and its checkpoint).
    per_epoch = batches_per_epoch(db, next(iter(runs)), params_batch_size(cluster_project))
    lines = [line.split() for line in chaos_nodes.log.read_text().splitlines() if line.startswith("batch ")]
    trained = Counter(trial for _, trial, _, noticed, _ in lines if noticed == "0")
    retries = {t["ray.trial_id"]: int(t.get("tune.retries", 0)) for t in runs.values()}
    redone = {trial: trained[trial] - EPOCHS * per_epoch for trial in retries}
    assert all(0 <= redone[t] <= retries[t] * per_epoch for t in retries), (redone, retries)
    moved = sum(len(t["ray.node_ids"].split(",")) > 1 for t in runs.values())

    # The kills took trials down: a trial training on the node just before its kill trained on elsewhere later.
    def took_down(node: str, at: float) -> bool:
        there = {trial for _, trial, on, noticed, t in lines if on == node and at - 2.5 < float(t) <= at}
        return any(trial in there and on != node and float(t) > at for _, trial, on, _, t in lines)

    hit = [node for node, at in kills if took_down(node, at)]
    lost = sum(redone.values()) / per_epoch
    print(
        f"{TRIALS} trials x {EPOCHS} epochs in {seconds:.0f} s; {len(kills)} kills at "
        f"{[round(at - started_at) for _, at in kills]} s ({len(hit)} of them took trials down); {moved} trials moved, "
        f"{sum(retries.values())} retries; redone "
        f"{sum(redone.values())} batches in all ({lost:.2f} epochs of {per_epoch} batches; at most "
        f"{max(redone.values()) / per_epoch:.2f} of an epoch per trial)"
    )
    assert len(hit) >= MIN_KILLS, kills
