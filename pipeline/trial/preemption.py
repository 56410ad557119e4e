"""A trial on a node being drained (a spot preemption, an autoscaler's notice) leaves it losing seconds, not an epoch.

Ray announces a node's end by draining it (``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
--deadline-remaining-seconds N``, the call an autoscaler or a spot-notice handler makes): the node takes no new work
and is killed at the deadline. A trial learns of it from ``DrainWatch``, which polls the cluster's draining nodes in a
thread, as Ray Train's own preemption watcher does (``ray._private.state.state.get_draining_nodes()``: Ray 2.60 has
no public call for it). The training loop asks ``DrainWatch.noticed`` before every batch (a flag: free), and on a
notice writes a checkpoint of the epoch in progress at that batch boundary (``pipeline.trial.loop``). Why the batch
boundary: a batch lasts well under a second at the paper's size and its state is exactly the next batch's input, so
nothing in the middle of one is worth saving, and the resumed epoch is bit for bit the uninterrupted one.

That checkpoint goes to the trial's storage folder (``DRAIN_MARKER`` names it and the epoch it continues), beside
Tune's: it is not reported to Tune, so Tune's iteration count, the schedulers and the MLflow run see no extra epoch.
The trial then waits for its node to end. The death of a worker on a node drained for preemption is an
``ActorDiedError`` with ``preempted=True``, which Tune retries from the trial's last reported checkpoint without
counting it against ``max_failures`` (``Trial._handle_ray_actor_error``): no ``sweep.max_failures`` is spent. The
retried trial resumes from the drain checkpoint instead of Tune's (``drained_checkpoint``) and finishes the epoch from
the next batch. It does so at any ``sweep.checkpoint_interval_s``: Tune's newest checkpoint may lag epochs behind the
drain's (the epochs between were reported without one), and the drain's is the newer state of the same deterministic
trial; only one older than Tune's newest (the trial has since checkpointed past it) is stale. The epochs the retry
skips are in the trial's MLflow run already (the driver logs each epoch once), and the schedulers count the
reported ``epoch``, not Tune's iterations. Exiting at once instead would be a worker death Ray does not mark as
preempted: it would count as a failure. A node that outlives its deadline by ``GRACE_S`` (or a drain without a
deadline) was not taken after all: the trial trains on in place.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray

from pipeline.trial.checkpoint import checkpoint_loads, load_checkpoint

log = logging.getLogger(__name__)

POLL_S = 1.0  # between two looks at the draining nodes: one small GCS request per trial per second
GRACE_S = 30.0  # a node still up this long after its drain deadline (or after a drain without one) was not taken
DRAIN_MARKER = "drain_checkpoint.json"  # in the trial's storage folder: {"checkpoint": folder, "epoch", "steps"}


class DrainWatch:
    """Whether this trial's node is being drained, polled every ``poll_s`` seconds in a daemon thread while the
    ``with`` block runs; ``noticed()`` is a flag read, cheap enough to ask before every batch."""

    def __init__(self, node_id: str, poll_s: float = POLL_S) -> None:
        self.node_id, self.poll_s = node_id, poll_s
        self.deadline_ms: int | None = None  # 0: drained without a deadline
        self.noticed_at: float | None = None  # time.time() of the notice
        self._notice, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._poll, name="drain-watch", daemon=True)

    def __enter__(self) -> DrainWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join(timeout=self.poll_s + 5)

    def noticed(self) -> bool:
        return self._notice.is_set()

    def _poll(self) -> None:
        while not self._done.is_set():
            try:
                draining = ray._private.state.state.get_draining_nodes()
            except Exception as err:  # noqa: BLE001  # a GCS hiccup must not end the trial: look again later
                log.debug("could not read the draining nodes: %s", err)
                draining = {}
            if self.node_id in draining:
                self.deadline_ms, self.noticed_at = int(draining[self.node_id]), time.time()
                log.warning("this node is being drained (deadline %s ms); checkpointing now", self.deadline_ms)
                self._notice.set()
                return
            self._done.wait(self.poll_s)

    def await_the_end(self, grace_s: float = GRACE_S) -> None:
        """Sleep until the node ends (this process ends with it), at most until ``grace_s`` past its deadline."""
        deadline = (self.deadline_ms or 0) / 1000 or (self.noticed_at or time.time())
        time.sleep(max(0.0, deadline + grace_s - time.time()))
        log.warning("node %s outlived its drain notice by %.0f s; training on here", self.node_id, grace_s)


def save_drain_checkpoint(checkpoint_dir: Path, fs: pafs.FileSystem, trial_path: str) -> dict[str, Any]:
    """Upload a mid-epoch checkpoint into the trial's storage folder ``trial_path`` on ``fs``, then (last, so a
    half-uploaded one is never used) the marker naming it; returns the marker."""
    payload = load_checkpoint(checkpoint_dir)
    marker = {"epoch": payload["epoch"], "steps": payload["epoch_progress"]["steps"]}
    marker["checkpoint"] = f"drain_checkpoint_e{marker['epoch']}_s{marker['steps']}"
    fs.create_dir(f"{trial_path}/{marker['checkpoint']}")
    pafs.copy_files(
        str(checkpoint_dir),
        f"{trial_path}/{marker['checkpoint']}",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=fs,
    )
    with fs.open_output_stream(f"{trial_path}/{DRAIN_MARKER}") as stream:
        stream.write(json.dumps(marker).encode())
    return marker


def drained_checkpoint(fs: pafs.FileSystem, trial_path: str, epoch: int, into: Path) -> Path | None:
    """The trial's drain checkpoint when it is at least as far as epoch ``epoch`` (the completed epochs of the
    checkpoint it would resume from otherwise, 0 for none), downloaded into ``into``; None when there is none, it
    continues an earlier epoch (stale: the trial has checkpointed past it) or it does not load."""
    if fs.get_file_info(f"{trial_path}/{DRAIN_MARKER}").type != pafs.FileType.File:
        return None
    with fs.open_input_stream(f"{trial_path}/{DRAIN_MARKER}") as stream:
        marker = json.loads(stream.readall())
    if marker["epoch"] < epoch:
        return None
    into.mkdir(parents=True, exist_ok=True)
    pafs.copy_files(
        f"{trial_path}/{marker['checkpoint']}",
        str(into),
        source_filesystem=fs,
        destination_filesystem=pafs.LocalFileSystem(),
    )
    if not checkpoint_loads(into):
        log.warning("drain checkpoint %s/%s does not load; not resuming from it", trial_path, marker["checkpoint"])
        return None
    log.info("resuming from the drain checkpoint: epoch %d, after batch %d", marker["epoch"] + 1, marker["steps"])
    return into


__all__ = ["DRAIN_MARKER", "GRACE_S", "POLL_S", "DrainWatch", "drained_checkpoint", "save_drain_checkpoint"]
