"""What would fail only after Ray started and the MLflow parent run exists, checked first and reported naming the key.

``python -m stages.tune`` (and ``--dry-run``, after printing what it would do) runs ``preflight`` before anything is
started or created: a problem costs seconds and one line, never a half-started sweep.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray

from pipeline.config import Params
from pipeline.io import check_store
from pipeline.sweep.cluster import check_cluster
from pipeline.sweep.estimate import check_trials_fit
from pipeline.sweep.manifest import read_tune_manifest
from pipeline.sweep.session import check_attachable, check_fits, local_capacity, ray_address
from pipeline.sweep.storage import check_storage, storage_dir
from pipeline.sweep.tracking import Store, tracking_uri


def preflight(params: Params, project_root: Path) -> None:
    """Refuse, naming the key: a machine too small for one trial (its memory too, ``estimate``), storage that cannot
    hold the Ray results, a tracking server that does not answer, an sqlite store corrupt or missing where the tune
    manifest says its runs are; a cluster that cannot be attached to and, with several nodes, ``cluster``'s checks."""
    address, nodes = ray_address(params.sweep), 0
    if ray.is_initialized():  # ray_session will use this Ray as it is
        available = ray.cluster_resources()
        check_fits(params.sweep, available.get("CPU", 0), available.get("GPU", 0), "the running Ray")
    elif address is None:  # a cluster (or its autoscaler) decides for itself
        check_fits(params.sweep, *local_capacity(), "this machine (a local Ray)")
    else:
        nodes = check_attachable(address)
    if address is None and params.sweep.resources.gpu == 0:  # trials train in this machine's memory
        check_trials_fit(params, project_root)
    storage = storage_dir(params, project_root)
    try:
        check_storage(storage)
    except ValueError as err:
        raise ValueError(f"sweep.storage_path: {err}") from None
    uri = tracking_uri(params.tracking, project_root)
    Store(uri).check_answers("tracking.uri")
    check_store(uri, manifest_naming(uri, project_root))
    if address is not None and not ray.is_initialized():
        check_cluster(params, address, storage, uri, nodes)


TUNE_MANIFEST = Path("results/tune/manifest.json")  # the tune stage's output, in the workspace (or the project)


def manifest_naming(uri: str, project_root: Path) -> Path | None:
    """The tune manifest that records runs in the store at ``uri``, if any: that store must not be replaced by a new
    empty one when its file is gone (``check_store``). The workspace's manifest counts only when the workspace belongs
    to ``project_root``: a sweep into another root (a benchmark's) would otherwise refuse a store it never had."""
    dvc_root = os.environ.get("DVC_ROOT")
    workspace_root = Path(dvc_root).resolve() if dvc_root else Path.cwd().resolve()
    candidates = [project_root / TUNE_MANIFEST]
    if workspace_root == project_root.resolve():
        candidates.insert(0, TUNE_MANIFEST)
    for path in dict.fromkeys(candidates):
        try:
            if path.is_file() and read_tune_manifest(path, project_root).tracking_uri == uri:
                return path
        except (ValueError, KeyError, OSError):  # unreadable or stale: the stage itself rewrites it
            continue
    return None
