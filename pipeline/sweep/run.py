"""The sweep as Ray Tune trials: variants x seeds, one trial each, checkpointed every epoch and resumable.

Why it is built this way:
- Only ``ray.tune.*`` APIs: reporting through Ray Train inside a Tune function is a hard error in Ray 2.60.
- A trial's config is ``{"variant", "seed", "fail_once_after_epoch"}``: small, so Tune's progress output stays
  readable, and the seed is in ``param_space`` (reproducible). The validated params (as JSON) and the dataset go
  through the object store (``with_parameters``); the trainable (``pipeline.trial.trainable``) rebuilds its typed
  config from them (``params.model_for(variant)``, ``params.train`` with the seed) without reading any file. They
  cannot drift on restore: the experiment name is their hash. The callback logs the trial's full config as MLflow
  params.
- Every epoch reports with a checkpoint; a failed trial is retried from it (``FailureConfig``) and an interrupted
  sweep is restored (``Tuner.restore``) because the experiment name is a hash of the params and ``storage_path`` is
  absolute. Trials never use their working directory: Ray moves them into scratch directories.
- MLflow is written by the driver only (``pipeline.sweep.tracking``).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import BasicVariantGenerator

from pipeline.config import Params, parse_params
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.sweep import tracking
from pipeline.sweep.identity import code_hash, experiment_name
from pipeline.sweep.manifest import ERROR, INTERRUPTED, STAGE, TrialRecord, TuneManifest
from pipeline.sweep.plan import METRIC, MODE, preflight, storage_dir
from pipeline.sweep.session import ray_session
from pipeline.trial.report import HEAD_HISTORY_FILE
from pipeline.trial.trainable import train_trial

log = logging.getLogger(__name__)


def trial_run_info(config: dict[str, Any], params_json: dict[str, Any]) -> tracking.TrialInfo:
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
        return any(t.status == INTERRUPTED for t in self.trials)

    @property
    def failed(self) -> bool:
        return any(t.status == ERROR for t in self.trials)

    def manifest(self) -> TuneManifest:
        return TuneManifest(
            params_hash=self.experiment_name.removeprefix(f"{STAGE}-"), experiment_name=self.experiment_name,
            ray_experiment_path=self.experiment_path, restored=self.restored, metric=METRIC, mode=MODE,
            tracking_uri=self.sweep.tracking_uri, experiment_id=self.sweep.experiment_id,
            parent_run_id=self.sweep.parent_run_id, trials=self.trials,
        )  # fmt: skip


def build_tuner(
    params: Params,
    data: PreparedData,
    path: Path,
    callback: tracking.MlflowTrialCallback,
    *,
    restore: bool,
    trials: list[dict[str, Any]] | None = None,
) -> tune.Tuner:
    """The Tuner of ``params.sweep``'s grid (variants x seeds), or of exactly the trial configs ``trials`` (the
    prune stage's fine-tuning runs); restored from ``path`` when ``restore``."""
    # Checkpointing every epoch with num_to_keep forces a state snapshot every few reports; each takes milliseconds
    # here, but short epochs make Tune warn on every one. Only that warning is switched off (user's value wins).
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    resources = {"cpu": params.sweep.resources.cpu, "gpu": params.sweep.resources.gpu}
    params_json = params.model_dump(mode="json")
    trainable = tune.with_parameters(train_trial, data=data, params_json=params_json, code_version=code_hash())
    trainable = tune.with_resources(trainable, resources)
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
    space: dict[str, Any] = {"variant": tune.grid_search(list(params.sweep.variants)),
                             "seed": tune.grid_search(list(params.sweep.seeds))}  # fmt: skip
    if trials is not None:  # each listed config once: Tune runs points_to_evaluate first, one per sample
        space = {key: None for trial in trials for key in trial}
    space["fail_once_after_epoch"] = params.sweep.fail_once_after_epoch
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode=MODE,
            scheduler=scheduler if trials is None else None,
            num_samples=1 if trials is None else len(trials),
            # max_concurrent here: TuneConfig.max_concurrent_trials is ignored with a search_alg instance.
            search_alg=BasicVariantGenerator(
                points_to_evaluate=trials, random_state=params.seed, max_concurrent=params.sweep.max_concurrent_trials
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
    run_info = functools.partial(trial_run_info, params_json=params.model_dump(mode="json"))
    callback = tracking.MlflowTrialCallback(sweep, run_info, base_tags, params.train.epochs)
    records = fit_tracked(params, data, path, sweep, callback, restore=restored)
    outcome = SweepOutcome(name, str(path), restored, sweep, records, dict(callback.calls), callback.epochs_logged)
    if outcome.interrupted:
        closed = tracking.close_interrupted(sweep)
        log.warning("sweep interrupted: %d trial run(s) marked KILLED; re-run to restore it from %s", closed, path)
    else:
        tracking.finish_sweep(sweep, "FAILED" if outcome.failed else "FINISHED",
                              {"tune.trials": str(len(outcome.trials))})  # fmt: skip
    return outcome


def fit_tracked(
    params: Params,
    data: PreparedData,
    path: Path,
    sweep: tracking.SweepRun,
    callback: tracking.MlflowTrialCallback,
    *,
    restore: bool,
    trials: list[dict[str, Any]] | None = None,
) -> list[TrialRecord]:
    """Run the Tuner in a Ray session and read back one record per trial; whatever stops it, no run stays RUNNING."""
    try:
        with ray_session(params.sweep):
            results = build_tuner(params, data, path, callback, restore=restore, trials=trials).fit()
        return trial_records(results, sweep)
    except BaseException:  # a lost cluster, a second Ctrl-C, an MLflow error: never leave runs RUNNING
        tracking.close_interrupted(sweep)
        raise


def trial_records(results: tune.ResultGrid, sweep: tracking.SweepRun) -> list[TrialRecord]:
    """One record per trial of ``results``, with its MLflow run (found by trial id, else by its variant/seed tags)."""
    runs = tracking.child_runs(sweep)
    by_variant_seed = {(run.data.tags.get("variant"), run.data.tags.get("seed")): run for run in runs.values()}
    records = []
    for result in results:
        trial_id = result.metrics.get("trial_id") or Path(result.path).name
        # A trial that failed before its first report has no trial_id in its metrics; its run is still tagged.
        run = runs.get(trial_id) or by_variant_seed.get((result.config["variant"], str(result.config["seed"])))
        epoch = int(result.metrics.get("epoch", 0))
        status = ERROR if result.error is not None else tracking.trial_outcome(run)
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
