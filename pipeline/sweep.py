"""The sweep as Ray Tune trials: variants x seeds, one trial each, checkpointed every epoch and resumable.

Why it is built this way (ecosystem.md 1.3-1.7, 5.1, recommendations 2-6):
- Only ``ray.tune.*`` APIs: reporting through Ray Train inside a Tune function is a hard error in Ray 2.60.
- A trial's config is ``{"variant", "seed", "fail_once_after_epoch"}``: small, so Tune's progress output stays
  readable, and the seed is in ``param_space`` (reproducible). The validated params (as JSON) and the dataset go
  through the object store (``with_parameters``); the trainable (``pipeline.trainable``) rebuilds its typed config
  from them (``params.model_for(variant)``, ``params.train`` with the seed) without reading any file. They cannot
  drift on restore: the experiment name is their hash. The callback logs the trial's full config as MLflow params.
- Every epoch reports with a checkpoint; a failed trial is retried from it (``FailureConfig``) and an interrupted
  sweep is restored (``Tuner.restore``) because the experiment name is a hash of the params and ``storage_path`` is
  absolute. Trials never use their working directory: Ray moves them into scratch directories.
- MLflow is written by the driver only (``pipeline.tracking``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import signal
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import BasicVariantGenerator

from pipeline import tracking
from pipeline.config import Params, params_hash, parse_params
from pipeline.data import PreparedData, content_hash
from pipeline.local_ray import check_fits, local_capacity, ray_address
from pipeline.paths import check_creatable_dir
from pipeline.train import HEAD_HISTORY_FILE
from pipeline.trainable import train_trial

log = logging.getLogger(__name__)

METRIC, MODE = "test_acc", "max"  # the one place the sweep's objective is named (ASHA, best trial)
STAGE = "tune"
PACKAGE_DIR = Path(__file__).resolve().parent  # pipeline/


# ---------------------------------------------------------------------------------------------------------------------
# What would run where
# ---------------------------------------------------------------------------------------------------------------------


def code_hash() -> str:
    """Hash of the library's source. Part of the sweep's identity: after a change to the training code, DVC re-runs
    the stage, and restoring the old, finished Ray experiment would silently return stale results."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def sweep_hash(params: Params, data_hash: str) -> str:
    """Identity of the sweep: every param the trials' results depend on (not where it runs or is stored), the
    library code that trains them and the prepared data's content hash (a re-prepared dataset is a new sweep)."""
    identity = params.model_dump(mode="json")
    for where in ("ray_address", "storage_path"):
        identity["sweep"].pop(where)
    identity["code"] = code_hash()
    identity["data"] = data_hash
    return params_hash(identity)


def experiment_name(params: Params, data_hash: str) -> str:
    return f"tune-{sweep_hash(params, data_hash)}"


def prepared_data_hash(params: Params, project_root: Path) -> str | None:
    """The content hash recorded in the prepared data's manifest (checked against the tensors when they are
    loaded), or None when the prepare stage has not run."""
    manifest = project_root / params.data.prepared_dir / "manifest.json"
    return json.loads(manifest.read_text())["content_sha256"] if manifest.is_file() else None


def storage_dir(params: Params, project_root: Path) -> Path:
    """Absolute Ray results dir: a relative ``sweep.storage_path`` resolves against the project root."""
    path = Path(params.sweep.storage_path).expanduser()
    return (path if path.is_absolute() else project_root / path).resolve()


def trial_grid(params: Params) -> list[dict[str, Any]]:
    """One row per trial (variants x seeds), with the resources each one asks Ray for."""
    resources = params.sweep.resources.model_dump()
    return [{"variant": v, "seed": s, **resources} for s in params.sweep.seeds for v in params.sweep.variants]


def preflight(params: Params, project_root: Path) -> None:
    """What would otherwise fail only after Ray has started and the MLflow parent run exists, checked first and
    reported naming the key: a local machine too small for one trial, storage that cannot hold the Ray results,
    a tracking server that does not answer."""
    if ray.is_initialized():  # ray_session will use this Ray as it is
        available = ray.cluster_resources()
        check_fits(params.sweep, available.get("CPU", 0), available.get("GPU", 0), "the running Ray")
    elif ray_address(params.sweep) is None:  # a cluster (or its autoscaler) decides for itself
        check_fits(params.sweep, *local_capacity(), "this machine (a local Ray)")
    try:
        check_creatable_dir(storage_dir(params, project_root))
    except ValueError as err:
        raise ValueError(f"sweep.storage_path: {err}") from None
    tracking.check_reachable(tracking.tracking_uri(params.tracking, project_root))


def describe_plan(params: Params, project_root: Path) -> str:
    """Human-readable dry run: the trial grid, resources, and where it would run and be recorded."""
    data = project_root / params.data.prepared_dir
    data_hash = prepared_data_hash(params, project_root)
    path = storage_dir(params, project_root) / experiment_name(params, data_hash or "missing")
    address = ray_address(params.sweep)
    grid = trial_grid(params)
    lines = [f"{'variant':<20} {'seed':>4} {'cpu':>5} {'gpu':>5}"]
    lines += [f"{t['variant']:<20} {t['seed']:>4} {t['cpu']:>5g} {t['gpu']:>5g}" for t in grid]
    asha = params.sweep.asha
    scheduler = f"ASHA (grace {asha.grace_period}, reduction {asha.reduction_factor})" if asha.enabled else "none"
    state = "would RESTORE the interrupted sweep" if tune.Tuner.can_restore(str(path)) else "new"
    lines += [
        "",
        f"trials: {len(grid)}, {params.train.epochs} epochs each, "
        f"at most {params.sweep.max_concurrent_trials} at a time, {params.sweep.max_failures} retries each",
        f"scheduler: {scheduler}, on {METRIC} ({MODE})",
        f"ray: {'attach to the cluster at ' + address if address else 'start a local Ray on this machine'}",
        f"ray results: {path} ({state})",
        f"mlflow: {tracking.tracking_uri(params.tracking, project_root)}, experiment {params.tracking.experiment!r}",
        f"data: {data} ({'content ' + data_hash[:12] if data_hash else 'MISSING: run the prepare stage'})",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# What the driver logs for a trial
# ---------------------------------------------------------------------------------------------------------------------


def describe_trial(config: dict[str, Any], params_json: dict[str, Any]) -> tracking.TrialInfo:
    """Run name, flattened params and tags of a trial's MLflow run (called by the driver-side callback)."""
    params = parse_params(params_json, "trial params")
    variant, seed = config["variant"], config["seed"]
    train_cfg = params.train.model_copy(update={"seed": seed})
    logged = {
        "variant": variant, "seed": seed, "model": params.model_for(variant).model_dump(mode="json"),
        "train": train_cfg.model_dump(mode="json"), "data": params.data.model_dump(mode="json"),
        "sweep": params.sweep.model_dump(mode="json", include={"resources", "asha", "max_failures",
                                                                 "fail_once_after_epoch"}),
    }  # fmt: skip
    tags = {"variant": variant, "seed": str(seed)}  # the sweep's own tags (params hash, commit, stage) are added too
    return tracking.TrialInfo(f"{variant}-seed{seed}", tracking.flatten(logged), tags)


# ---------------------------------------------------------------------------------------------------------------------
# The sweep (runs in the driver)
# ---------------------------------------------------------------------------------------------------------------------


@contextmanager
def ray_session(params: Params) -> Iterator[str]:
    """Attach to ``sweep.ray_address`` / ``RAY_ADDRESS``, or start a local Ray bound to 127.0.0.1; say which."""
    if ray.is_initialized():
        log.info("ray: using the Ray already initialised in this process")
        yield "existing"
        return
    address = ray_address(params.sweep)
    caller_sigterm = signal.getsignal(signal.SIGTERM)
    if address:
        log.info("ray: attaching to the cluster at %s", address)
        ray.init(address=address)
    else:
        log.info("ray: starting a local Ray on this machine (127.0.0.1; token auth as configured)")
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
        if (node_ip := ray.util.get_node_ip_address()) != "127.0.0.1":
            log.warning("ray: the local Ray advertises %s, not 127.0.0.1 (see pipeline.local_ray)", node_ip)
    if callable(caller_sigterm) and threading.current_thread() is threading.main_thread():
        # ray.init replaces the process's SIGTERM handler with one that exits at once; keep the caller's (the
        # stages stop on SIGTERM as on Ctrl-C, so Tune saves its state and the MLflow runs are closed).
        signal.signal(signal.SIGTERM, caller_sigterm)
    try:
        yield address or "local"
    finally:
        ray.shutdown()


@dataclass
class TrialRecord:
    """One trial in the manifest: what prune and analyze need to find its run, checkpoint and head history."""

    trial_id: str
    run_id: str | None
    run_name: str | None
    variant: str
    seed: int
    status: str  # tracking.FINISHED | EARLY_STOPPED | ERROR | INTERRUPTED
    epochs_completed: int
    metrics: dict[str, float]
    checkpoint_dir: str | None  # absolute path of the last checkpoint dir (checkpoint.pt, head_history.json)
    head_history: str | None  # absolute path of head_history.json (None: the model has no Gaussian heads)
    artifacts: dict[str, str] = field(default_factory=dict)  # MLflow artifact URIs of the same files


@dataclass
class SweepOutcome:
    experiment_name: str
    experiment_path: str
    restored: bool  # this run continued an interrupted sweep
    sweep: tracking.SweepRun
    trials: list[TrialRecord]
    mlflow_calls: dict[str, int] = field(default_factory=dict)  # client requests by method, this run
    epochs_logged: int = 0

    @property
    def interrupted(self) -> bool:
        return any(t.status == tracking.INTERRUPTED for t in self.trials)

    @property
    def failed(self) -> bool:
        return any(t.status == tracking.ERROR for t in self.trials)

    def metrics_summary(self) -> dict[str, dict[str, float]]:
        """Final test accuracy per variant: mean, std and count over seeds, of the trials that ran to their end
        (finished, or stopped early by ASHA); for ``dvc metrics show``."""
        per_variant: dict[str, list[float]] = {}
        for trial in self.trials:
            if trial.status in (tracking.FINISHED, tracking.EARLY_STOPPED) and "test_acc" in trial.metrics:
                per_variant.setdefault(trial.variant, []).append(trial.metrics["test_acc"])
        return {
            variant: {"test_acc": statistics.fmean(accs), "test_acc_std": statistics.pstdev(accs), "seeds": len(accs)}
            for variant, accs in sorted(per_variant.items())
        }

    def manifest(self) -> dict[str, Any]:
        return {
            "stage": STAGE, "params_hash": self.experiment_name.removeprefix("tune-"),
            "experiment_name": self.experiment_name, "ray_experiment_path": self.experiment_path,
            "restored": self.restored, "metric": METRIC, "mode": MODE,
            "tracking_uri": self.sweep.tracking_uri, "experiment_id": self.sweep.experiment_id,
            "parent_run_id": self.sweep.parent_run_id, "trials": [asdict(t) for t in self.trials],
        }  # fmt: skip


def _tuner(
    params: Params, data: PreparedData, path: Path, callback: tracking.MlflowTrialCallback, *, restore: bool
) -> tune.Tuner:
    # Checkpointing every epoch with num_to_keep forces a state snapshot every few reports; each takes milliseconds
    # here, but short epochs make Tune warn on every one. Only that warning is switched off (user's value wins).
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    resources = {"cpu": params.sweep.resources.cpu, "gpu": params.sweep.resources.gpu}
    params_json = params.model_dump(mode="json")
    trainable = tune.with_resources(tune.with_parameters(train_trial, data=data, params_json=params_json), resources)
    if restore:
        log.info("ray: restoring the interrupted sweep at %s", path)
        tuner = tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True)
        # Tune brings back the callbacks pickled in tuner.pkl, with the first run's tracking URI, tags and counters.
        # Use this run's callback instead; Tune still restores its trial -> MLflow run map (get_state/set_state)
        # from the experiment directory, so the trials continue their own runs.
        tuner._local_tuner.get_run_config().callbacks = [callback]
        return tuner
    asha = params.sweep.asha
    scheduler = (ASHAScheduler(time_attr="training_iteration", max_t=params.train.epochs,
                               grace_period=asha.grace_period, reduction_factor=asha.reduction_factor)
                 if asha.enabled else None)  # fmt: skip
    return tune.Tuner(
        trainable,
        param_space={
            "variant": tune.grid_search(list(params.sweep.variants)),
            "seed": tune.grid_search(list(params.sweep.seeds)),
            "fail_once_after_epoch": params.sweep.fail_once_after_epoch,
        },
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode=MODE,
            scheduler=scheduler,
            # max_concurrent here: TuneConfig.max_concurrent_trials is ignored with a search_alg instance.
            search_alg=BasicVariantGenerator(
                random_state=params.seed, max_concurrent=params.sweep.max_concurrent_trials
            ),
            reuse_actors=True,  # a new trial reuses a finished trial's worker: no second torch import / spawn
        ),  # fmt: skip
        run_config=tune.RunConfig(
            name=path.name,
            storage_path=str(path.parent),
            verbose=1,
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=params.sweep.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),  # fmt: skip
    )


def run_sweep(params: Params, data: PreparedData, project_root: Path) -> SweepOutcome:
    """Run (or restore and finish) the sweep; the driver opens the MLflow parent run before any trial starts."""
    preflight(params, project_root)
    name = experiment_name(params, content_hash(data))
    path = storage_dir(params, project_root) / name
    restored = tune.Tuner.can_restore(str(path))
    uri = tracking.tracking_uri(params.tracking, project_root)
    commit = tracking.git_commit(project_root)
    base_tags = {"dvc_stage": STAGE, "params_hash": name.removeprefix("tune-"), "git_commit": commit,
                 "mlflow.source.git.commit": commit}  # fmt: skip
    sweep_params = tracking.flatten({"sweep": params.sweep.model_dump(mode="json"), "epochs": params.train.epochs})
    sweep = tracking.open_sweep_run(
        uri, params.tracking.experiment, path, run_name=name,
        tags={**base_tags, "ray.experiment_path": str(path), "sweep.role": "parent"}, params=sweep_params,
        project_root=project_root,
    )  # fmt: skip
    describe = functools.partial(describe_trial, params_json=params.model_dump(mode="json"))
    callback = tracking.MlflowTrialCallback(sweep, describe, base_tags, params.train.epochs)
    try:
        with ray_session(params):
            results = _tuner(params, data, path, callback, restore=restored).fit()
        records = _records(results, sweep)
    except BaseException:  # a lost cluster, a second Ctrl-C, an MLflow error: never leave runs RUNNING
        tracking.close_interrupted(sweep)
        raise
    outcome = SweepOutcome(name, str(path), restored, sweep, records, dict(callback.calls), callback.epochs_logged)
    if outcome.interrupted:
        closed = tracking.close_interrupted(sweep)
        log.warning("sweep interrupted: %d trial run(s) marked KILLED; re-run to restore it from %s", closed, path)
    else:
        tracking.finish_sweep(sweep, "FAILED" if outcome.failed else "FINISHED",
                              {"tune.trials": str(len(outcome.trials))})  # fmt: skip
    return outcome


def _records(results: tune.ResultGrid, sweep: tracking.SweepRun) -> list[TrialRecord]:
    runs = tracking.child_runs(sweep)
    by_variant_seed = {(run.data.tags.get("variant"), run.data.tags.get("seed")): run for run in runs.values()}
    records = []
    for result in results:
        trial_id = result.metrics.get("trial_id") or Path(result.path).name
        # A trial that failed before its first report has no trial_id in its metrics; its run is still tagged.
        run = runs.get(trial_id) or by_variant_seed.get((result.config["variant"], str(result.config["seed"])))
        epoch = int(result.metrics.get("epoch", 0))
        status = tracking.ERROR if result.error is not None else tracking.trial_outcome(run)
        checkpoint = result.checkpoint.path if result.checkpoint is not None else None
        history = str(Path(checkpoint) / HEAD_HISTORY_FILE) if checkpoint else None
        history = history if history and Path(history).is_file() else None
        artifacts = {}
        if run is not None and "tune.checkpoint" in run.data.tags:  # set only once the upload succeeded
            base = f"runs:/{run.info.run_id}/checkpoint"
            artifacts = {"checkpoint": base} | ({"head_history": f"{base}/{HEAD_HISTORY_FILE}"} if history else {})
        metrics = {k: float(result.metrics[k]) for k in ("epoch", *tracking.EPOCH_METRICS) if k in result.metrics}
        records.append(TrialRecord(
            trial_id, run.info.run_id if run else None, run.info.run_name if run else None,
            result.config["variant"], int(result.config["seed"]), status, epoch, metrics, checkpoint, history,
            artifacts,
        ))  # fmt: skip
    return sorted(records, key=lambda r: (r.variant, r.seed))
