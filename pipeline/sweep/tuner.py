"""The Ray Tune side of a tracked run: the Tuner of exactly the trials that train, a trial's config, restoring.

Only ``ray.tune.*`` APIs (reporting through Ray Train inside a Tune function is a hard error in Ray 2.60). A trial's
config is small (``variant``, ``seed``, ``resume_from``, ``resume_run``; prune's ``init_from``); the validated params
(as JSON) and the dataset go through the object store (``with_parameters``), and cannot drift on restore: the
experiment name is their hash. A failed trial is retried from its last checkpoint (``FailureConfig``) and an
interrupted run restored (``Tuner.restore``) from the absolute ``storage_path``.
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any

from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import BasicVariantGenerator

from pipeline.config import Params
from pipeline.data.prepared import PreparedData
from pipeline.sweep.cluster import late_node_check
from pipeline.sweep.identity import trial_codes
from pipeline.sweep.manifest import METRIC, MODE
from pipeline.sweep.progress import progress_reporter
from pipeline.sweep.reuse import RESUME, TrialDecision
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking import MetricsTarget, MlflowTrialCallback, Store, train_with_system_metrics
from pipeline.sweep.worker_deaths import (
    count_a_reset_death_once,
    count_drained_sigterm_as_preemption,
    count_worker_deaths_as_failures,
)
from pipeline.trial.trainable import train_trial

log = logging.getLogger(__name__)

TUNER_FILE = "tuner.pkl"  # Tune's saved Tuner in the experiment folder (it pickles the callbacks by module path)


def saved_by_tune(path: StoragePath) -> bool:
    """Whether Tune keeps an experiment's state at ``path`` (restorable or not by this driver)."""
    return tune.Tuner.can_restore(str(path))


def restorable(path: StoragePath) -> bool:
    """Whether this driver can restore the interrupted run at ``path``: Tune's saved Tuner unpickles. One saved by a
    driver whose modules have since moved does not: the run starts anew and finds its trials in the store."""
    if not saved_by_tune(path):
        return False
    try:
        pickle.loads((path / TUNER_FILE).read_bytes())
    except (AttributeError, ImportError, pickle.UnpicklingError) as err:
        log.warning(
            "ray: %s was saved by another version of the driver (%s); its trials are looked up in MLflow "
            "instead of restored",
            path,
            err,
        )
        return False
    return True


def interrupted(path: StoragePath, tracking_uri: str) -> bool:
    """Whether the sweep at ``path`` is one to restore: restorable, and its parent run did not end FINISHED. A finished
    sweep's trials are reused like any finished run, so the dry run, the log and the manifest all say "reuse"."""
    return restorable(path) and not Store(tracking_uri).parent_finished(path)


def trial_config(decision: TrialDecision) -> dict[str, Any]:
    """A trial's Tune config: its variant and seed, and for a resumed trial the checkpoint and MLflow run it
    continues (``pipeline.trial.trainable``, ``MlflowTrialCallback.on_trial_start``)."""
    resume = decision.action == RESUME
    return {
        "variant": decision.variant,
        "seed": decision.seed,
        "resume_from": decision.checkpoint_dir if resume else None,
        "resume_run": decision.run_id if resume else None,
    }


def build_tuner(
    params: Params,
    data: PreparedData,
    path: StoragePath,
    callback: MlflowTrialCallback,
    *,
    restore: bool,
    trials: list[dict[str, Any]],
) -> tune.Tuner:
    """The Tuner of exactly the trial configs ``trials`` (each ``{"variant", "seed", ...}``: the sweep's trials that
    are not reused, or the prune stage's fine-tuning runs); restored from ``path`` when ``restore``."""
    # With num_to_keep, a trial's every second checkpoint forces a snapshot of the whole experiment (spaced out by
    # sweep.checkpoint_interval_s); short epochs make Tune warn on every one. Only that warning is switched off (the
    # user's value wins).
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    count_worker_deaths_as_failures()  # a worker the memory monitor kills costs its trial one attempt, not the sweep
    count_drained_sigterm_as_preemption()  # a node drained by Ray's SIGTERM handler costs no attempt
    count_a_reset_death_once()  # a reused actor dying as it resets for a trial costs that trial one attempt
    reporter = progress_reporter()  # here, as it picks Ray's output engine: a restored Tuner brings back its own copy
    resources = {"cpu": params.sweep.resources.cpu, "gpu": params.sweep.resources.gpu}
    params_json = params.model_dump(mode="json")
    # The trial reads a number: ``auto`` chosen from this sweep's size (``SweepConfig.checkpoint_interval``).
    params_json["sweep"]["checkpoint_interval_s"] = params.sweep.checkpoint_interval(len(trials))
    # The trial with its run's system metrics sampled in the worker (tracking/system_metrics.py) unless the params
    # switch them off; named as before.
    target = (
        MetricsTarget(callback.parent.tracking_uri, callback.parent.experiment_id)
        if params.tracking.system_metrics
        else None
    )
    # Each trial checks that its node runs the code the driver's identity of its variant names (a restored run's
    # trials are the sweep's too).
    variants = sorted({trial["variant"] for trial in trials} | set(params.sweep.variants))
    trainable = tune.with_parameters(
        train_with_system_metrics,
        data=data,
        params_json=params_json,
        code_version=trial_codes(params, variants),
        node_check=late_node_check(params, path, callback.parent.tracking_uri),  # nodes that join later
        system_metrics=target,
    )
    trainable.__name__ = train_trial.__name__
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
    scheduler = (
        ASHAScheduler(
            time_attr="epoch",
            max_t=params.train.epochs,
            grace_period=asha.grace_period,
            reduction_factor=asha.reduction_factor,
        )
        if asha.enabled
        else None
    )
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
        ),
        run_config=tune.RunConfig(
            name=path.name,
            storage_path=str(path.parent),
            verbose=1,
            progress_reporter=reporter,
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=params.sweep.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),
    )
