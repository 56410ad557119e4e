"""What a sweep would run, where, and whether it can: the trial grid, the checks made before Ray starts, the dry run.

Everything here runs in the driver before any trial: ``preflight`` catches what would otherwise fail only after Ray
has started and the MLflow parent run exists, and ``format_plan`` is what ``python -m stages.tune --dry-run`` prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ray
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from ray import tune

from pipeline.config import Params
from pipeline.io import check_tracking_server
from pipeline.sweep import tracking
from pipeline.sweep.cluster import check_cluster
from pipeline.sweep.identity import experiment_name, prepared_data_hash, trial_key
from pipeline.sweep.reuse import REUSE, TrialPlan, plan_trials, read_plan
from pipeline.sweep.session import check_attachable, check_fits, local_capacity, ray_address
from pipeline.sweep.storage import StoragePath, check_storage, is_uri

METRIC, MODE = "test_acc", "max"  # the one place the sweep's objective is named (ASHA, best trial)


def storage_dir(params: Params, project_root: Path) -> StoragePath:
    """The Ray results folder: a URI as given, a relative ``sweep.storage_path`` resolved against the project root."""
    if is_uri(params.sweep.storage_path):
        return StoragePath(params.sweep.storage_path)
    path = Path(params.sweep.storage_path).expanduser()
    return StoragePath((path if path.is_absolute() else project_root / path).resolve())


def trial_grid(params: Params) -> list[dict[str, Any]]:
    """One row per trial (variants x seeds), with the resources each one asks Ray for."""
    resources = params.sweep.resources.model_dump()
    return [{"variant": v, "seed": s, **resources} for s in params.sweep.seeds for v in params.sweep.variants]


def sweep_plans(params: Params, data_hash: str, uri: str, experiment_id: str | None) -> list[TrialPlan]:
    """Per trial of the grid (variants x seeds, in that order): reuse, resume or train (``pipeline.sweep.reuse``)."""
    trials = [(v, s, trial_key(params, v, s, data_hash)) for s in params.sweep.seeds for v in params.sweep.variants]
    return plan_trials(uri, experiment_id, trials, params.train.epochs, retrain=params.sweep.retrain)


def preflight(params: Params, project_root: Path) -> None:
    """What would otherwise fail only after Ray has started and the MLflow parent run exists, checked first and
    reported naming the key: a local machine too small for one trial, storage that cannot hold the Ray results,
    a tracking server that does not answer; on a cluster, one that cannot be attached to (address, token) within
    seconds and, with several nodes, storage they do not share, other trial code on a node, an sqlite store."""
    address, nodes = ray_address(params.sweep), 0
    if ray.is_initialized():  # ray_session will use this Ray as it is
        available = ray.cluster_resources()
        check_fits(params.sweep, available.get("CPU", 0), available.get("GPU", 0), "the running Ray")
    elif address is None:  # a cluster (or its autoscaler) decides for itself
        check_fits(params.sweep, *local_capacity(), "this machine (a local Ray)")
    else:
        nodes = check_attachable(address)
    storage = storage_dir(params, project_root)
    try:
        check_storage(storage)
    except ValueError as err:
        raise ValueError(f"sweep.storage_path: {err}") from None
    uri = tracking.tracking_uri(params.tracking, project_root)
    check_tracking_server(uri, "tracking.uri")
    if address is not None and not ray.is_initialized():
        check_cluster(params, address, storage, uri, nodes)


def planned_trials(params: Params, project_root: Path, data_hash: str | None) -> tuple[list[TrialPlan] | None, str]:
    """What the sweep would do with each trial (reuse / resume / train) and the sweep's state, read without creating
    anything: the restored sweep's own plan, else a look-up in the tracking store (None when it cannot answer)."""
    path = storage_dir(params, project_root) / experiment_name(params, data_hash or "missing")
    uri = tracking.tracking_uri(params.tracking, project_root)
    if data_hash is None:
        return None, "new"
    try:
        restorable = tune.Tuner.can_restore(str(path))
    except OSError as err:  # a bucket that does not answer: the preflight after the plan says so, naming the key
        return None, f"unknown: cannot read it ({str(err).splitlines()[0][:200]})"
    if restorable:
        state = "interrupted: would restore it"
        if tracking.sweep_finished(path, uri):
            state = "finished: nothing to train (`dvc repro --force` restores it and trains nothing)"
        return read_plan(path), state
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None, "new"  # no store yet, so no earlier runs (and a dry run creates none)
    try:
        check_tracking_server(uri, "tracking.uri")
        experiment = MlflowClient(uri).get_experiment_by_name(params.tracking.experiment)
    except (ValueError, MlflowException) as err:
        return None, f"new (cannot look up earlier runs: {err})"
    experiment_id = experiment.experiment_id if experiment and experiment.lifecycle_stage == "active" else None
    return sweep_plans(params, data_hash, uri, experiment_id), "new"


def stale_data(params: Params, project_root: Path) -> list[str]:
    """How the prepared data on disk differs from what ``params.data`` asks for (empty when it matches or is missing):
    a dry run must not present, say, the digits prepared for the smoke profile as the paper's CIFAR-10."""
    path = project_root / params.data.prepared_dir / "manifest.json"
    if not path.is_file():
        return []
    prepared = json.loads(path.read_text())
    shape = prepared.get("image_shape") or [None, None, None]
    found = {"data.dataset": prepared.get("dataset"), "data.image_size": shape[-1],
             "data.test_fraction": prepared.get("test_fraction")}  # fmt: skip
    wanted = {"data.dataset": params.data.dataset, "data.image_size": params.data.image_size,
              "data.test_fraction": params.data.test_fraction}  # fmt: skip
    return [f"{key} is {wanted[key]!r} but the prepared data has {found[key]!r}"
            for key in wanted if found[key] is not None and found[key] != wanted[key]]  # fmt: skip


def format_plan(params: Params, project_root: Path) -> str:
    """The dry run, human-readable: per trial what would happen (reuse a run, resume it, train), resources, and where
    it would run and be recorded."""
    data = project_root / params.data.prepared_dir
    data_hash = prepared_data_hash(params, project_root)
    path = storage_dir(params, project_root) / experiment_name(params, data_hash or "missing")
    address = ray_address(params.sweep)
    plans, state = planned_trials(params, project_root, data_hash)
    action = {(p.variant, p.seed): p.describe() for p in plans or []}
    grid = trial_grid(params)
    lines = [f"{'variant':<20} {'seed':>4} {'cpu':>5} {'gpu':>5}  plan"]
    lines += [f"{t['variant']:<20} {t['seed']:>4} {t['cpu']:>5g} {t['gpu']:>5g}  "
              f"{action.get((t['variant'], t['seed']), 'train')}" for t in grid]  # fmt: skip
    asha = params.sweep.asha
    scheduler = f"ASHA (grace {asha.grace_period}, reduction {asha.reduction_factor})" if asha.enabled else "none"
    to_train = sum(p.action != REUSE for p in plans) if plans is not None else len(grid)
    lines += [
        "",
        f"trials: {len(grid)} ({to_train} to train or resume), {params.train.epochs} epochs each, "
        f"at most {params.sweep.max_concurrent_trials} at a time, {params.sweep.max_failures} retries each",
        f"scheduler: {scheduler}, on {METRIC} ({MODE})",
        f"ray: {'attach to the cluster at ' + address if address else 'start a local Ray on this machine'}",
        f"ray results: {path} ({state})",
        f"mlflow: {tracking.tracking_uri(params.tracking, project_root)}, experiment {params.tracking.experiment!r}",
        f"data: {data} ({'content ' + data_hash[:12] if data_hash else 'MISSING: run the prepare stage'})",
    ]
    if stale := stale_data(params, project_root):
        lines.append(f"data is STALE: {'; '.join(stale)}; `dvc repro` re-prepares it before the sweep (the plan above "
                     "is for the data on disk)")  # fmt: skip
    return "\n".join(lines)
