"""What a multi-node cluster must offer before a sweep starts, proved on every alive node before any MLflow run exists;
nodes that join later (an autoscaler's) are checked by the trials that run on them (``late_node_check``).

- **Shared storage**: Ray (since 2.7) never copies checkpoints between nodes, so every node must see
  ``sweep.storage_path``; the probe: the driver writes a marker, a task pinned to each node reads it and writes its
  own, the driver reads those back.
- **The driver's trial code**: the same task computes, per variant of the sweep, the identity of the code a trial
  would run on that node (``pipeline.trial.code_version``).
- **One tracking store**: an sqlite file lives on the driver's disk only (``tracking.sqlite_on_cluster`` insists).
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from typing import Any

from pipeline.config import Params
from pipeline.sweep.identity import PROJECT_ROOT, trial_codes
from pipeline.sweep.session import code_runtime_env
from pipeline.sweep.storage import StoragePath
from pipeline.trial.node_check import MARKER, SHARED_HELP, NodeCheck

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0  # a node's first task sets up the runtime env (unpacks the code): seconds, more on a busy node


def store_refusal(params: Params, uri: str, why: str) -> str | None:
    """Why an sqlite tracking store cannot serve a sweep spread over several nodes (``why``), unless the user insists;
    None when it can."""
    if not uri.startswith("sqlite") or params.tracking.sqlite_on_cluster:
        return None
    return (
        f"tracking.uri: {uri} is a file on this machine only, and {why}; run one `mlflow server` every machine can "
        "reach and set tracking.uri to its http:// address (docs/cluster.md, One MLflow server), or set "
        "tracking.sqlite_on_cluster: true to keep the runs on this machine anyway"
    )


def check_tracking_store(params: Params, uri: str, nodes: int) -> None:
    """Refuse an sqlite tracking store for a sweep spread over several nodes, unless the user insists."""
    if refusal := store_refusal(params, uri, f"the cluster has {nodes} nodes"):
        raise ValueError(refusal)


def late_node_check(params: Params, experiment: StoragePath, uri: str) -> NodeCheck:
    """For the trials to check their own node (``pipeline.trial.node_check``): a fresh token in the experiment folder,
    and the driver's node (ray is connected). A node that joins after ``check_cluster`` is checked by its trials."""
    import ray

    token = uuid.uuid4().hex
    experiment.mkdir()
    (experiment / MARKER).write_text(token)
    refusal = store_refusal(params, uri, "the sweep's trials run on other nodes")
    return NodeCheck(token, str(experiment.parent), ray.get_runtime_context().get_node_id(), refusal)


def node_view(storage: StoragePath, marker: str, token: str, models: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Run on one node: does it see the driver's marker, can it leave its own, which code would a trial of each
    variant (``models``: its arch and encoding) run there. A bucket is opened with the node's own credentials, as its
    trials will."""
    import ray

    from pipeline.trial.code_version import trial_code

    node = ray.get_runtime_context().get_node_id()
    try:
        path = storage / marker
        seen = path.is_file() and path.read_text() == token
    except OSError:  # a bucket this node cannot read (credentials, network): reported as not seen
        seen = False
    try:
        (storage / f"{marker}.{node}").write_text(token)
        wrote = ""
    except OSError as err:
        wrote = f"{type(err).__name__}: {err}"
    code = {variant: trial_code(arch, encoding) for variant, (arch, encoding) in models.items()}
    return {"node_id": node, "ip": ray.util.get_node_ip_address(), "seen": seen, "wrote": wrote, "code": code}


def probe_nodes(
    storage: StoragePath, models: dict[str, tuple[str, str]], timeout_s: float = PROBE_TIMEOUT_S
) -> list[dict[str, Any]]:
    """One ``node_view`` task pinned to every alive node of the connected cluster; the marker files are removed."""
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    storage.mkdir()
    marker, token = f".storage-probe-{uuid.uuid4().hex}", uuid.uuid4().hex
    (storage / marker).write_text(token)
    task = ray.remote(num_cpus=0, max_retries=0)(node_view)  # num_cpus=0: runs even while trials hold every CPU
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    try:
        pending = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                storage, marker, token, models
            )
            for node in nodes
        ]
        try:
            views = ray.get(pending, timeout=timeout_s)
        except GetTimeoutError:
            raise ValueError(
                f"sweep.storage_path: not every node answered the storage probe within {timeout_s:g} s "
                "(a node busy setting up or unhealthy): see `ray status`"
            ) from None
        for view in views:
            reply = storage / f"{marker}.{view['node_id']}"
            view["driver_sees_reply"] = reply.is_file() and reply.read_text() == token
        return views
    finally:
        for path in [storage / marker, *(storage / f"{marker}.{node}" for node in nodes)]:
            path.delete()


def check_views(views: list[dict[str, Any]], storage: StoragePath, driver_code: dict[str, str]) -> None:
    """Raise naming the key for the first node that does not share the storage or runs other trial code."""
    for view in views:
        node = f"node {view['ip']} ({view['node_id'][:8]})"
        if not view["seen"]:
            raise ValueError(
                f"sweep.storage_path: {storage} is not shared: {node} does not see the driver's files; {SHARED_HELP}"
            )
        if view["wrote"]:
            raise ValueError(f"sweep.storage_path: {storage} is not writable on {node} ({view['wrote']})")
        if not view["driver_sees_reply"]:
            raise ValueError(
                f"sweep.storage_path: {storage} is not shared: the driver does not see what {node} "
                f"wrote there; {SHARED_HELP}"
            )
        for variant, code in driver_code.items():
            if view["code"].get(variant) != code:
                raise ValueError(
                    f"{node} imports trial code {view['code'].get(variant)} for {variant}, the driver runs {code}: it "
                    "does not use the code shipped with the job (runtime_env working_dir); check the node's PYTHONPATH "
                    "and installed packages"
                )


def check_cluster(params: Params, address: str, storage: StoragePath, uri: str, nodes: int) -> None:
    """Before the sweep on a cluster of ``nodes`` alive nodes: one tracking store, shared storage, the driver's code
    on every node. Connects with the sweep's runtime env and disconnects; the stage connects again for the sweep."""
    if nodes < 2:
        return  # one node: its storage and code are what the trials use anyway
    check_tracking_store(params, uri, nodes)
    import ray

    models = {v: (params.model_for(v).arch, params.model_for(v).encoding) for v in params.sweep.variants}
    caller_sigterm = signal.getsignal(signal.SIGTERM)  # ray.init replaces it; ray_session keeps the stage's
    ray.init(address=address, runtime_env=code_runtime_env(PROJECT_ROOT), log_to_driver=False)
    try:
        views = probe_nodes(storage, models)
    finally:
        ray.shutdown()
        if caller_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, caller_sigterm)
    check_views(views, storage, trial_codes(params, params.sweep.variants))
    log.info("cluster: %d nodes share %s and run the driver's trial code", len(views), storage)
