"""What a finished run says in MLflow: the parent run's description and summary metrics, and the registered models.

Without these the runs table shows a parent row ``tune-<hash>`` with no metric until it is expanded. The parent gets
a description (``mlflow.note.content``, shown as Markdown on the run page: what was swept, on which data, how to
read it) and ``test_acc.<variant>``, the mean final test accuracy over seeds (the manifest's ``metrics.json``
numbers), so the collapsed table already compares variants. The best trial of each variant (highest final test
accuracy) has its model registered as ``<experiment>.<variant>`` with its run as source.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from pipeline.sweep.manifest import COMPLETED, TrialRecord
from pipeline.sweep.tracking.logged_model import using_tracking_uri
from pipeline.sweep.tracking.store import mlflow_client
from pipeline.sweep.tracking.tags import MODEL_URI_TAG, NOTE_TAG

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
        "epoch (`step` = epoch), its artifacts hold the final checkpoint, and its model is an MLflow model. "
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
    """Register the final model of each variant's best trial as ``<experiment>.<variant><suffix>`` (a new version
    unless this run's model is already one); return variant -> registered name. Trials whose model was not logged
    are skipped. The prune stage registers its fine-tuned models with ``suffix="_pruned"``."""
    client = mlflow_client(tracking_uri)
    with using_tracking_uri(tracking_uri):  # the registry resolves a version's ``models:/`` source through it
        return _register(client, experiment, trials, suffix)


def _register(client: MlflowClient, experiment: str, trials: list[TrialRecord], suffix: str) -> dict[str, str]:
    registered = {}
    for variant, trial in sorted(best_trials(trials).items()):
        model_uri = client.get_run(str(trial.run_id)).data.tags.get(MODEL_URI_TAG)
        if model_uri is None:
            log.warning("MLflow: run %s of %s has no logged model; not registered", trial.run_id, variant)
            continue
        name = f"{experiment}.{variant}{suffix}"
        if client.search_registered_models(f"name = '{name}'") == []:
            client.create_registered_model(name, description=f"Best seed of {variant} in each sweep, by final test_acc")
        versions = client.search_model_versions(f"name = '{name}' and run_id = '{trial.run_id}'")
        if not any(version.source == model_uri for version in versions):
            version = client.create_model_version(
                name,
                source=model_uri,
                run_id=trial.run_id,
                model_id=model_uri.removeprefix("models:/"),
                description=f"{trial.run_name}: final test_acc {trial.metrics['test_acc']:.4f}",
            )
            log.debug("MLflow: registered %s version %s (run %s)", name, version.version, trial.run_id)
        registered[variant] = name
    log.info("MLflow: best model of each variant in the registry: %s", ", ".join(registered.values()) or "none")
    return registered


def publish_summary(tracking_uri: str, parent_run_id: str, summary: SweepSummary, trials: list[TrialRecord]) -> None:
    """Register the best models, then give the parent run its summary metrics and description."""
    client = mlflow_client(tracking_uri)
    experiment = client.get_experiment(client.get_run(parent_run_id).info.experiment_id).name
    registered = register_best_models(tracking_uri, experiment, trials)
    now = int(time.time() * 1000)
    metrics = [Metric(f"test_acc.{variant}", acc["test_acc"], now, 0) for variant, acc in summary.accuracy.items()]
    client.log_batch(parent_run_id, metrics=metrics, tags=[RunTag(NOTE_TAG, summary_note(summary, registered))])
