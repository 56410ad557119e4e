"""The sweep as Ray Tune trials: variants x seeds, one trial each, checkpointed every epoch and resumable.

Why it is built this way:
- Only ``ray.tune.*`` APIs: reporting through Ray Train inside a Tune function is a hard error in Ray 2.60.
- Only the trials that are not reused go to Tune (``pipeline.sweep.reuse``): a trial whose identity already has a
  finished run is listed with that run, an unfinished one continues it from its checkpoint.
- A trial's config is ``{"variant", "seed", "resume_from", "resume_run"}``: small, and the seed is in
  ``param_space`` (reproducible); the progress table shows only variant and seed of it. The validated params
  (as JSON) and the dataset go through the object store (``with_parameters``); the trainable
  (``pipeline.trial.trainable``) rebuilds its typed config from them (``params.model_for(variant)``, ``params.train``
  with the seed) without reading any file. They cannot drift on restore: the experiment name is their hash. The
  callback logs the trial's full config as MLflow params.
- Every epoch reports with a checkpoint; a failed trial is retried from it (``FailureConfig``) and an interrupted
  sweep is restored (``Tuner.restore``) because the experiment name is a hash of the params and ``storage_path`` is
  absolute. Trials never use their working directory: Ray moves them into scratch directories.
- MLflow is written by the driver only (``pipeline.sweep.tracking``), through a buffer that keeps the writes on disk
  while the tracking server is down (``pipeline.sweep.tracking_buffer``): the sweep trains on, the writes are replayed
  when the server answers, and whatever earlier runs left buffered is replayed before this one plans anything.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import BasicVariantGenerator

from pipeline.config import Params, parse_params
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.sweep import tracking
from pipeline.sweep.identity import code_hash, experiment_name, trial_key
from pipeline.sweep.logged_model import PreparedDataset
from pipeline.sweep.manifest import EARLY_STOPPED, ERROR, FINISHED, INTERRUPTED, STAGE, TrialRecord, TuneManifest
from pipeline.sweep.plan import METRIC, MODE, preflight, storage_dir, sweep_plans
from pipeline.sweep.progress import progress_reporter
from pipeline.sweep.reuse import KEY_TAG, RESUME, REUSE, TrialPlan, read_plan, write_plan
from pipeline.sweep.session import ray_session
from pipeline.sweep.storage import StoragePath, driver_dir
from pipeline.sweep.submit import SubmittedJob
from pipeline.sweep.summary import publish_sweep
from pipeline.sweep.tracking_buffer import FINAL_WAIT_S, flush_buffers, is_outage, park_buffer
from pipeline.trial.report import HEAD_HISTORY_FILE
from pipeline.trial.trainable import train_trial

log = logging.getLogger(__name__)


def trial_run_info(config: dict[str, Any], params_json: dict[str, Any], data_hash: str) -> tracking.TrialInfo:
    """Run name, flattened params and tags (with its ``trial_key``) of a trial's MLflow run (called by the driver-side
    callback)."""
    params = parse_params(params_json, "trial params")
    variant, seed = config["variant"], config["seed"]
    train_cfg = params.train.model_copy(update={"seed": seed})
    logged = {
        "variant": variant, "seed": seed, "model": params.model_for(variant).model_dump(mode="json"),
        "train": train_cfg.model_dump(mode="json"), "data": params.data.model_dump(mode="json"),
        "sweep": params.sweep.model_dump(mode="json", include={"resources", "asha", "max_failures",
                                                                 "fail_once_after_epoch"}),
    }  # fmt: skip
    tags = {"variant": variant, "seed": str(seed), KEY_TAG: trial_key(params, variant, seed, data_hash)}
    # the sweep's own tags (params hash, commit, stage) are added too
    return tracking.TrialInfo(f"{variant}-seed{seed}", tracking.flatten(logged), tags)


@dataclass
class SweepOutcome:
    experiment_name: str
    experiment_path: str
    restored: bool  # this run continued an interrupted sweep (logged, not in the manifest: it flips on a restore)
    sweep: tracking.SweepRun
    trials: list[TrialRecord]
    mlflow_calls: dict[str, int] = field(default_factory=dict)  # client requests by method, this run
    epochs_logged: int = 0
    plans: list[TrialPlan] = field(default_factory=list)  # per trial: reused, resumed or trained
    buffered: int = 0  # MLflow writes still waiting in buffer_file: the server did not answer by the end
    buffer_file: str | None = None

    @property
    def trained(self) -> int:
        """Trials that went to Tune in this run (trained or resumed), as opposed to reused."""
        return sum(plan.action != REUSE for plan in self.plans)

    @property
    def interrupted(self) -> bool:
        return any(t.status == INTERRUPTED for t in self.trials)

    @property
    def failed(self) -> bool:
        return any(t.status == ERROR for t in self.trials)

    def manifest(self) -> TuneManifest:
        return TuneManifest(
            params_hash=self.experiment_name.removeprefix(f"{STAGE}-"), experiment_name=self.experiment_name,
            ray_experiment_path=self.experiment_path, metric=METRIC, mode=MODE,
            tracking_uri=self.sweep.tracking_uri, experiment_id=self.sweep.experiment_id,
            parent_run_id=self.sweep.parent_run_id, trials=self.trials,
        )  # fmt: skip


def build_tuner(
    params: Params,
    data: PreparedData,
    path: StoragePath,
    callback: tracking.MlflowTrialCallback,
    *,
    restore: bool,
    trials: list[dict[str, Any]],
) -> tune.Tuner:
    """The Tuner of exactly the trial configs ``trials`` (each ``{"variant", "seed", ...}``: the sweep's trials that
    are not reused, or the prune stage's fine-tuning runs); restored from ``path`` when ``restore``."""
    # Checkpointing every epoch with num_to_keep forces a state snapshot every few reports; each takes milliseconds
    # here, but short epochs make Tune warn on every one. Only that warning is switched off (user's value wins).
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    reporter = progress_reporter()  # here, as it picks Ray's output engine: a restored Tuner brings back its own copy
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
    # On the trial's epoch, not Tune's iteration count: a trial resumed from an earlier sweep's checkpoint starts at
    # its epoch k + 1 but at iteration 1.
    scheduler = (ASHAScheduler(time_attr="epoch", max_t=params.train.epochs,
                               grace_period=asha.grace_period, reduction_factor=asha.reduction_factor)
                 if asha.enabled else None)  # fmt: skip
    # Each listed config once: Tune runs points_to_evaluate first, one per sample.
    space: dict[str, Any] = {key: None for trial in trials for key in trial}
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode=MODE,
            scheduler=scheduler,
            num_samples=len(trials),
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
            progress_reporter=reporter,
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=params.sweep.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),  # fmt: skip
    )


def trial_config(plan: TrialPlan) -> dict[str, Any]:
    """A trial's Tune config: its variant and seed, and for a resumed trial the checkpoint and MLflow run it
    continues (``pipeline.trial.trainable``, ``MlflowTrialCallback.on_trial_start``)."""
    resume = plan.action == RESUME
    return {"variant": plan.variant, "seed": plan.seed, "resume_from": plan.checkpoint_dir if resume else None,
            "resume_run": plan.run_id if resume else None}  # fmt: skip


def run_sweep(params: Params, data: PreparedData, project_root: Path, *,
              submitted: SubmittedJob | None = None) -> SweepOutcome:  # fmt: skip
    """Run (or restore and finish) the trials of the sweep that are not reused; the driver opens the MLflow parent
    run and decides what to reuse before any trial starts. ``project_root``: where the stores resolve
    (``location.store_root``). ``submitted``: this driver is a Ray job submitted from a workstation
    (``pipeline.sweep.submit``), whose commit and submission id the runs record."""
    preflight(params, project_root)
    storage = storage_dir(params, project_root)
    local = driver_dir(storage, project_root)  # what the driver keeps on its own disk (the outage buffer)
    flush_buffers(storage, local)  # reuse and restore read the runs: bring them up to date first
    data_hash = content_hash(data)
    name = experiment_name(params, data_hash)
    path = storage / name
    restored = tune.Tuner.can_restore(str(path))
    uri = tracking.tracking_uri(params.tracking, project_root)
    commit = submitted.git_commit if submitted else tracking.git_commit(project_root)
    base_tags = {"dvc_stage": STAGE, "params_hash": name.removeprefix("tune-"), "git_commit": commit}
    job_tags = submitted.tags() if submitted else {}
    sweep_params = tracking.flatten({"sweep": params.sweep.model_dump(mode="json"), "epochs": params.train.epochs})
    sweep = tracking.open_sweep_run(
        uri, params.tracking.experiment, path, run_name=name,
        tags={**base_tags, **job_tags, "ray.experiment_path": str(path), "sweep.role": "parent"}, params=sweep_params,
        project_root=project_root, default_store=params.tracking.uri is None,
    )  # fmt: skip
    # A restored sweep continues the plan it was started with (its Tune experiment holds exactly those trials).
    plans = read_plan(path) if restored else None
    if plans is None:
        plans = sweep_plans(params, data_hash, uri, sweep.experiment_id)
        write_plan(path, plans)
    to_train = [trial_config(plan) for plan in plans if plan.action != REUSE]
    log.info("sweep %s: %s", name, ", ".join(f"{p.variant} seed {p.seed}: {p.describe()}" for p in plans))
    run_info = functools.partial(trial_run_info, params_json=params.model_dump(mode="json"), data_hash=data_hash)
    dataset = PreparedDataset.of(params.data, data_hash, project_root)
    callback = tracking.MlflowTrialCallback(sweep, run_info, base_tags, params.train.epochs, dataset, local / name,
                                            storage)  # fmt: skip
    reused = reused_records(sweep, plans)  # read now, while the server is known to answer
    records = fit_tracked(params, data, path, sweep, callback, restore=restored, trials=to_train) if to_train else []
    records = sorted(records + reused, key=lambda r: (r.variant, r.seed))
    outcome = SweepOutcome(name, str(path), restored, sweep, records, dict(callback.calls), callback.epochs_logged,
                           plans)  # fmt: skip
    buffer = callback.buffer
    if outcome.interrupted:
        closed = tracking.close_interrupted(callback)
        log.warning("sweep interrupted: %d trial run(s) marked KILLED; re-run to restore it from %s", closed, path)
    else:
        tracking.record_sweep_trials(sweep, [{**plan.to_dict(), "run_id": _run_of(plan, records)} for plan in plans],
                                     buffer)  # fmt: skip
        if buffer.flush(force=True):  # the summary reads the runs; with the server down, the next run publishes it
            publish_sweep(params, data_hash, outcome)
        tracking.finish_sweep(sweep, "FAILED" if outcome.failed else "FINISHED",
                              {"tune.trials": str(len(outcome.trials)), "tune.trials_trained": str(outcome.trained),
                               "tune.trials_reused": str(len(plans) - outcome.trained)}, buffer)  # fmt: skip
    outcome.buffered, outcome.buffer_file = buffer.pending, str(buffer.path)
    if buffer.pending and buffer.path is not None and path.remote:
        park_buffer(buffer.path, path)
    return outcome


def _run_of(plan: TrialPlan, records: list[TrialRecord]) -> str | None:
    return next((r.run_id for r in records if (r.variant, r.seed) == (plan.variant, plan.seed)), plan.run_id)


def reused_records(sweep: tracking.SweepRun, plans: list[TrialPlan]) -> list[TrialRecord]:
    """The manifest's records of the reused trials, read from their finished runs."""
    reused = [plan for plan in plans if plan.action == REUSE]
    if not reused:
        return []
    client = MlflowClient(sweep.tracking_uri)
    records = []
    for plan in reused:
        run = client.get_run(str(plan.run_id))
        metrics = {**run.data.metrics, "epoch": plan.epoch}  # the latest value of each; the epoch is their step
        record = _record(run.data.tags.get("ray.trial_id", ""), (run.info.run_id, run.info.run_name, run.data.tags),
                         plan.variant, plan.seed, FINISHED, metrics, plan.checkpoint_dir)  # fmt: skip
        record.reused = True
        uploaded = [a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run.info.run_id, "checkpoint")]
        if HEAD_HISTORY_FILE in uploaded:  # listed even when the Ray copy of the checkpoint is gone
            record.artifacts["head_history"] = f"{record.artifacts['checkpoint']}/{HEAD_HISTORY_FILE}"
        records.append(record)
    return records


def fit_tracked(
    params: Params,
    data: PreparedData,
    path: StoragePath,
    sweep: tracking.SweepRun,
    callback: tracking.MlflowTrialCallback,
    *,
    restore: bool,
    trials: list[dict[str, Any]],
) -> list[TrialRecord]:
    """Run the Tuner in a Ray session and read back one record per trial; whatever stops it, no run stays RUNNING.
    MLflow writes buffered during an outage are flushed at the end, waiting up to ``FINAL_WAIT_S`` for the server."""
    try:
        with ray_session(params.sweep):
            results = build_tuner(params, data, path, callback, restore=restore, trials=trials).fit()
        callback.buffer.wait_flushed(FINAL_WAIT_S)
        return trial_records(results, sweep, callback)
    except BaseException:  # a lost cluster, a second Ctrl-C, an MLflow error: never leave runs RUNNING
        tracking.close_interrupted(callback)
        raise


def trial_records(
    results: tune.ResultGrid, sweep: tracking.SweepRun, callback: tracking.MlflowTrialCallback
) -> list[TrialRecord]:
    """One record per trial of ``results``, with its MLflow run: the callback's (trial id -> run id, which includes
    runs continued from an earlier sweep), else the sweep's child run tagged with its trial id or its variant and seed
    (a trial that failed before its first report). While the store cannot be read (the server down, writes still
    buffered), what the callback wrote stands for the run: its id, name, tags and how the trial ended."""
    run_ids = callback.run_ids()
    runs = _stored_runs(sweep, run_ids) if callback.buffer.flush(force=True) else None
    by_variant_seed = {(run.data.tags.get("variant"), run.data.tags.get("seed")): run for run in (runs or {}).values()}
    records = []
    for result in results:
        trial_id = result.metrics.get("trial_id") or Path(result.path).name
        if result.config is None:  # still PENDING when the sweep stopped (Ctrl-C): never started, has no run
            records.append(TrialRecord(trial_id, None, None, "", -1, INTERRUPTED, 0, {}, None, None))
            continue
        if runs is None:
            name, tags = callback.written(trial_id) or (None, {})
            run = (run_ids[trial_id], name, tags) if trial_id in run_ids else None
            label = tags.get("tune.status")
            outcome = label if label in (FINISHED, EARLY_STOPPED, ERROR) else INTERRUPTED
        else:
            # A trial that failed before its first report has no trial_id in its metrics; its run is still tagged.
            found = runs.get(trial_id) or by_variant_seed.get((result.config["variant"], str(result.config["seed"])))
            run = (found.info.run_id, found.info.run_name, found.data.tags) if found is not None else None
            outcome = tracking.trial_outcome(found)
        status = ERROR if result.error is not None else outcome
        checkpoint = str(callback.location_of(result.checkpoint.path)) if result.checkpoint is not None else None
        records.append(_record(trial_id, run, result.config["variant"], int(result.config["seed"]), status,
                               result.metrics, checkpoint))  # fmt: skip
    return records


def _stored_runs(sweep: tracking.SweepRun, run_ids: dict[str, str]) -> dict[str, Any] | None:
    """The sweep's child runs and the runs the callback continued, by trial id; None when the server is down."""
    try:
        runs = tracking.child_runs(sweep)
        client = MlflowClient(sweep.tracking_uri)
        return runs | {trial_id: client.get_run(run_id) for trial_id, run_id in run_ids.items() if trial_id not in runs}
    except MlflowException as err:
        if not is_outage(err):
            raise
        return None


def _record(trial_id: str, run: tuple[str, str | None, dict[str, str]] | None, variant: str, seed: int, status: str,
            metrics: dict[str, Any], checkpoint: str | None) -> TrialRecord:  # fmt: skip
    """A manifest record from a trial's last metrics and checkpoint and its MLflow run (id, name, tags)."""
    run_id, run_name, tags = run if run is not None else (None, None, {})
    history = StoragePath(checkpoint) / HEAD_HISTORY_FILE if checkpoint else None
    history = str(history) if history and history.is_file() else None
    artifacts = {}
    if run_id is not None and "tune.checkpoint" in tags:  # set only once the upload succeeded
        base = f"runs:/{run_id}/checkpoint"
        artifacts = {"checkpoint": base} | ({"head_history": f"{base}/{HEAD_HISTORY_FILE}"} if history else {})
    values = {k: float(metrics[k]) for k in ("epoch", *tracking.EPOCH_METRICS) if k in metrics}
    return TrialRecord(
        trial_id, run_id, run_name, variant, seed, status,
        int(values.get("epoch", 0)), values, checkpoint, history, artifacts, trial_key=tags.get(KEY_TAG),
        sweep_run_id=tags.get("mlflow.parentRunId"), failure_reason=tags.get(tracking.FAILURE_REASON_TAG),
    )  # fmt: skip
