"""What a finished run says in MLflow: the parent run's description and summary metrics, and the registered models.

Without these the runs table shows a parent row with no metric until it is expanded. The parent gets a Markdown
description and ``test_acc.<variant>`` (the mean final test accuracy over seeds), so the collapsed table compares
variants. Each variant's best trial has its model logged from its checkpoint (the only trials that get an MLflow model:
``logged_model.log_run_model``) and registered as ``<experiment>.<variant>``, tagged with its sweep, params hash and
trial key; alias ``best`` follows the version with the highest test accuracy.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from pipeline.sweep.manifest import COMPLETED, TrialRecord
from pipeline.sweep.tracking.logged_model import log_run_model, using_tracking_uri
from pipeline.sweep.tracking.store import mlflow_client
from pipeline.sweep.tracking.tags import KEY_TAG, NOTE_TAG, PARENT_TAG
from pipeline.trial.checkpoint import CorruptCheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepSummary:
    """What the parent run's description states; ``accuracy`` is ``TuneManifest.metrics_summary()``."""

    title: str  # e.g. "Sweep of 5 variants x 1 seed"
    data: str  # e.g. "digits 16x16 (prepared data sha256 3c18bfa94854)"
    epochs: int
    accuracy: dict[str, dict[str, float]]  # variant -> test_acc, test_acc_std, test_acc_n (seeds)


def summary_note(summary: SweepSummary, registered: dict[str, str]) -> str:
    """The parent run's Markdown description."""
    rows = [
        f"| {variant} | {acc['test_acc']:.4f} | {acc['test_acc_std']:.4f} | {int(acc['test_acc_n'])} |"
        for variant, acc in sorted(summary.accuracy.items(), key=lambda item: -item[1]["test_acc"])
    ]
    lines = [
        f"**{summary.title}**, {summary.epochs} epochs each, on {summary.data}.",
        "",
        "Each child run (expand this row) is one trial: its params are the full config, its metrics are logged per "
        "epoch (`step` = epoch) and its artifacts hold the final checkpoint; the best seed of each variant also has "
        "its model as an MLflow model, registered. "
        "`test_acc.<variant>` on this run is the final test accuracy averaged over seeds; select the children and "
        "*Compare* to plot `test_acc` per epoch.",
        "",
        "| variant | final test acc (mean) | std | seeds |",
        "|---|---|---|---|",
        *rows,
    ]
    if registered:
        names = ", ".join(f"`{name}`" for name in registered.values())
        lines += ["", f"Registered models (best seed of each variant): {names}"]
    return "\n".join(lines)


def best_trials(trials: list[TrialRecord]) -> dict[str, TrialRecord]:
    """Per variant, the completed trial with the highest final test accuracy that has a run."""
    best: dict[str, TrialRecord] = {}
    for trial in trials:
        if trial.status not in COMPLETED or trial.run_id is None or "test_acc" not in trial.metrics:
            continue
        current = best.get(trial.variant)
        if current is None or trial.metrics["test_acc"] > current.metrics["test_acc"]:
            best[trial.variant] = trial
    return best


def register_best_models(
    tracking_uri: str, experiment: str, trials: list[TrialRecord], suffix: str = ""
) -> dict[str, str]:
    """Register the final model of each variant's best trial as ``<experiment>.<variant><suffix>`` (logged from its
    checkpoint first unless its run has one; a new version unless this run's model is one already); variant ->
    registered name. A tracking error only warns."""
    client = mlflow_client(tracking_uri)
    try:
        with using_tracking_uri(tracking_uri):  # the registry resolves a version's ``models:/`` source through it
            return _register(client, tracking_uri, experiment, trials, suffix)
    except MlflowException as err:
        log.warning("MLflow: could not register the models: %s", err)
        return {}


BEST_ALIAS = "best"  # ``models:/<name>@best``: the version with the highest final test_acc of all sweeps
VERSION_TAGS = ("params_hash", KEY_TAG, "variant", "seed")  # copied from the version's run


def model_description(variant: str, suffix: str) -> str:
    """The registered model's description: what one version is, and what the alias points to."""
    what = (
        f"{variant} pruned (degenerate heads cut) and fine-tuned, from the best seed of the sweep it came from"
        if suffix == "_pruned"
        else f"{variant}, the seed with the best final test_acc of a sweep"
    )
    return (
        f"One version per sweep: {what}. Alias `{BEST_ALIAS}` is the version with the highest final test_acc. "
        "Version tags: the sweep's parent run (`sweep_run_id`), `params_hash`, the trial's identity (`trial_key`), "
        "`test_acc`."
    )


def _register(
    client: MlflowClient, tracking_uri: str, experiment: str, trials: list[TrialRecord], suffix: str
) -> dict[str, str]:
    registered = {}
    for variant, trial in sorted(best_trials(trials).items()):
        run = client.get_run(str(trial.run_id))
        try:
            model_uri = log_run_model(client, tracking_uri, run)
        except (OSError, MlflowException, CorruptCheckpointError) as err:  # no checkpoint that loads: none to register
            log.warning("MLflow: run %s of %s has no model to register: %s", trial.run_id, variant, err)
            continue
        name = f"{experiment}.{variant}{suffix}"
        description = model_description(variant, suffix)
        if client.search_registered_models(f"name = '{name}'") == []:
            client.create_registered_model(name, description=description)
        else:  # a model registered by an earlier version of this code keeps no stale description
            client.update_registered_model(name, description=description)
        versions = client.search_model_versions(f"name = '{name}' and run_id = '{trial.run_id}'")
        if not any(version.source == model_uri for version in versions):
            tags = {key: run.data.tags[key] for key in VERSION_TAGS if key in run.data.tags}
            tags |= {"sweep_run_id": run.data.tags.get(PARENT_TAG, ""), "test_acc": f"{trial.metrics['test_acc']:.6f}"}
            version = client.create_model_version(
                name,
                source=model_uri,
                run_id=trial.run_id,
                tags=tags,
                model_id=model_uri.removeprefix("models:/"),
                description=f"{trial.run_name}: final test_acc {trial.metrics['test_acc']:.4f} "
                f"({trial.epochs_completed} epochs; sweep run {tags['sweep_run_id']})",
            )
            log.debug("MLflow: registered %s version %s (run %s)", name, version.version, trial.run_id)
        _point_best_alias(client, name)
        registered[variant] = name
    log.info("MLflow: best model of each variant in the registry: %s", ", ".join(registered.values()) or "none")
    return registered


def _point_best_alias(client: MlflowClient, name: str) -> None:
    """Alias ``best`` on the version with the highest ``test_acc`` tag (versions registered without one are not
    candidates)."""
    scored = [
        (float(version.tags["test_acc"]), int(version.version))
        for version in client.search_model_versions(f"name = '{name}'")
        if "test_acc" in version.tags
    ]
    if scored:
        client.set_registered_model_alias(name, BEST_ALIAS, str(max(scored)[1]))


def publish_summary(tracking_uri: str, parent_run_id: str, summary: SweepSummary, trials: list[TrialRecord]) -> None:
    """Register the best models, then give the parent run its summary metrics and description; a tracking error only
    warns, as in ``register_best_models``."""
    client = mlflow_client(tracking_uri)
    now = int(time.time() * 1000)
    metrics = [Metric(f"test_acc.{variant}", acc["test_acc"], now, 0) for variant, acc in summary.accuracy.items()]
    try:
        experiment = client.get_experiment(client.get_run(parent_run_id).info.experiment_id).name
        registered = register_best_models(tracking_uri, experiment, trials)
        client.log_batch(parent_run_id, metrics=metrics, tags=[RunTag(NOTE_TAG, summary_note(summary, registered))])
    except MlflowException as err:
        log.warning("MLflow: could not write the sweep's summary: %s", err)
