"""The cluster preflight's checks, made again by a trial on the node it runs on: nodes can join after the sweep began.

The driver probes every node alive when the sweep starts (``pipeline.sweep.cluster``); a cluster that autoscales from
zero workers has none then, and a node that joins later was never asked. So each trial, before it trains, checks its
own node: it sees the driver's marker in the sweep's storage (``MARKER``, a token the driver wrote into the experiment
folder: the storage is shared) and, when the tracking store is a file on the driver's machine (sqlite, refused on a
cluster unless ``tracking.sqlite_on_cluster``), that it runs on the driver's node. The trial code is checked by
``code_version.check_trial_code``. A node that fails fails the trial with the preflight's own message, naming the
key, before any training; a read of one small file per trial start is all it costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs

MARKER = ".node-check"  # in the experiment folder: the driver's token
SHARED_HELP = (
    "on a multi-node cluster it must be one file system mounted at the same path on every node (NFS, EFS, Lustre, "
    "a CephFS mount) or a bucket every node can reach with its own credentials (s3://bucket/ray), so trials can "
    "write and restore their checkpoints anywhere"
)


@dataclass(frozen=True)
class NodeCheck:
    """What a trial checks on its node, from the driver (plain data: Tune pickles it with the trainable)."""

    token: str  # the content of the driver's MARKER
    storage: str  # sweep.storage_path as the driver resolved it, for the message
    driver_node: str  # the driver's Ray node: the only one that may write an sqlite store
    store_refusal: str | None = None  # the preflight's message for a tracking store on the driver's disk only


def check_node(check: NodeCheck | None, fs: pafs.FileSystem, experiment_fs_path: str, node: str, ip: str) -> None:
    """Raise ``ValueError`` naming the key when this node (``node``, at ``ip``) cannot run the sweep's trials."""
    if check is None:
        return
    where = f"node {ip} ({node[:8]})"
    if check.store_refusal is not None and node != check.driver_node:
        raise ValueError(f"{check.store_refusal} (a trial runs on {where}, which joined after the sweep started)")
    try:
        with fs.open_input_stream(f"{experiment_fs_path}/{MARKER}") as stream:
            seen = stream.readall().decode() == check.token
    except OSError:  # missing (not shared), or a bucket this node cannot read: not seen
        seen = False
    if not seen:
        raise ValueError(
            f"sweep.storage_path: {check.storage} is not shared: {where} does not see the driver's files; {SHARED_HELP}"
        )


__all__ = ["MARKER", "SHARED_HELP", "NodeCheck", "check_node"]
