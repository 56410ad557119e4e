"""The tune stage's sweep: variants x seeds as Ray Tune trials, tracked in MLflow, the finished runs reused.

The sweep's own part of the tracked run it shares with prune (``pipeline.sweep.tracked``): the grid and the reuse
decision per trial (only trials not reused go to Tune), what a trial's run is called and holds (``trial_run_info``),
the records of reused trials (read before Tune starts, while the store answers), what a finished sweep publishes
(``publish_sweep``: the parent's description and summary, the registry) and its manifest (``tune_manifest``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.config import Params, parse_params
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.data.subset import kept_per_class
from pipeline.encodings import encoding_fields, spec_for
from pipeline.sweep.grid import sweep_decisions
from pipeline.sweep.identity import experiment_name, trial_key
from pipeline.sweep.manifest import FINISHED, METRIC, MODE, STAGE, TrialRecord, TuneManifest, accuracy_summary
from pipeline.sweep.preflight import preflight
from pipeline.sweep.reuse import REUSE, TrialDecision
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.submit import SubmittedJob
from pipeline.sweep.tracked import TrackedOutcome, TrackedStage, run_tracked, trial_record
from pipeline.sweep.tracking import (
    ParentRun,
    PreparedDataset,
    Store,
    SweepSummary,
    TrackingBuffer,
    TrialInfo,
    tags,
    tracking_uri,
)
from pipeline.sweep.tuner import trial_config
from pipeline.trial.report import HEAD_HISTORY_FILE

log = logging.getLogger(__name__)


# The model fields each architecture is built from (``pipeline.models.build_model``): a run logs only these, so the
# UI's Compare view never draws ResNet18 through "quadratic / 9 heads". The trial's identity still hashes them all.
RESNET_FIELDS = ("arch", "resnet_width")
ATTENTION_ONLY_TRAIN = ("positional_lr_factor",)  # the positional encoding's own learning-rate factor


def applicable_model(model: dict[str, Any]) -> dict[str, Any]:
    """The fields of a model config (as dumped) that its architecture and encoding use."""
    if model["arch"] in ("resnet18", "t_resnet18"):  # t_resnet18: a ResNet18 rebuilt as attention (finetune.transform)
        return {key: model[key] for key in RESNET_FIELDS}
    own = spec_for(model["encoding"]).fields  # the encoding's registry entry declares the fields it reads
    unused = {"resnet_width", *(set(encoding_fields()) - set(own))}
    return {key: value for key, value in model.items() if key not in unused}


def run_name(variant: str, seed: int) -> str:
    """A trial's run name as the runs table shows it: ``sa_quadratic_9 seed 0``."""
    return f"{variant} seed {seed}"


def trial_run_info(
    config: dict[str, Any], params_json: dict[str, Any], data_hash: str, class_counts: tuple[int, ...] | None = None
) -> TrialInfo:
    """Run name, flattened params and tags (with its ``trial_key``) of a trial's MLflow run: the params that apply to
    the variant's architecture (``applicable_model``) and, given ``class_counts``, ``train_images``."""
    params = parse_params(params_json, "trial params")
    variant, seed = config["variant"], config["seed"]
    model = params.model_for(variant).model_dump(mode="json")
    train = params.train_for(variant).model_copy(update={"seed": seed}).model_dump(mode="json")
    if model["arch"] == "resnet18":
        train = {key: value for key, value in train.items() if key not in ATTENTION_ONLY_TRAIN}
    run_settings = {"resources", "asha", "max_failures"}  # not the retry tests' hook (sweep.fail_once_after_epoch)
    logged = {
        "variant": variant,
        "seed": seed,
        "model": applicable_model(model),
        "train": train,
        "data": params.data.model_dump(mode="json"),
        "sweep": params.sweep.model_dump(mode="json", include=run_settings),
    }
    if class_counts is not None:
        logged["train_images"] = sum(kept_per_class(count, train["data_fraction"]) for count in class_counts)
    run_tags = {"variant": variant, "seed": str(seed), tags.KEY_TAG: trial_key(params, variant, seed, data_hash)}
    # the sweep's own tags (params hash, commit, stage) are added too
    return TrialInfo(run_name(variant, seed), tags.flatten(logged), run_tags)


class Sweep(TrackedStage):
    """The tune stage's part of the tracked run: its grid, reuse, records of reused trials and what it publishes."""

    def __init__(
        self,
        params: Params,
        data_hash: str,
        project_root: Path,
        submitted: SubmittedJob | None,
        class_counts: tuple[int, ...] | None = None,
    ) -> None:
        self.params, self.data_hash, self.class_counts = params, data_hash, class_counts
        self.name, self.work = experiment_name(params, data_hash), "sweep"
        self.run_name = tags.parent_run_name(STAGE, params, project_root, self.name)
        self.tracking_uri = tracking_uri(params.tracking, project_root)
        self.experiment = params.tracking.experiment
        commit = submitted.git_commit if submitted else tags.git_commit(project_root)
        self.tags = {"dvc_stage": STAGE, "params_hash": self.name.removeprefix(f"{STAGE}-"), "git_commit": commit}
        self.parent_tags = submitted.tags() if submitted else {}
        sweep = params.sweep.model_dump(mode="json", exclude={"fail_once_after_epoch"})  # a test hook, never a param
        self.parent_params = tags.flatten({"sweep": sweep, "epochs": params.train.epochs})
        self.tuner_params = params
        self.dataset = PreparedDataset.of(params.data, data_hash, project_root)
        self.reused: list[TrialRecord] = []
        self.seen: dict[str, Any] = {}  # the runs the plan read, by id: the reused trials' records need no request

    def decide(self, parent: ParentRun) -> list[TrialDecision]:
        return sweep_decisions(self.params, self.data_hash, parent.tracking_uri, parent.experiment_id, seen=self.seen)

    def trials(self, decisions: list[TrialDecision], path: StoragePath) -> tuple[list[dict], Callable]:
        # read now, while the server is known to answer
        self.reused = reused_records(self.tracking_uri, decisions, self.seen)
        run_info = functools.partial(
            trial_run_info,
            params_json=self.params.model_dump(mode="json"),
            data_hash=self.data_hash,
            class_counts=self.class_counts,
        )
        return [trial_config(d) for d in decisions if d.action != REUSE], run_info

    def wrap_up(
        self, parent: ParentRun, decisions: list[TrialDecision], records: list[TrialRecord], buffer: TrackingBuffer
    ) -> dict[str, str]:
        trained = sum(d.action != REUSE for d in decisions)
        if buffer.flush(force=True):  # the summary reads the runs; with the server down, the next run publishes it
            publish_sweep(self.params, self.data_hash, parent, by_trial(records + self.reused))
        trials = {"tune.trials": str(len(records) + len(self.reused)), "tune.trials_trained": str(trained)}
        return {**trials, "tune.trials_reused": str(len(decisions) - trained)}


def run_sweep(
    params: Params, data: PreparedData, project_root: Path, *, submitted: SubmittedJob | None = None
) -> TrackedOutcome:
    """Run (or restore and finish) the trials of the sweep that are not reused; the outcome's records hold every trial
    of the grid. ``submitted``: this driver is a Ray job (``pipeline.sweep.submit``), whose commit the runs record."""
    preflight(params, project_root)
    class_counts = tuple(torch.bincount(data.train_labels, minlength=data.num_classes).tolist())
    sweep = Sweep(params, content_hash(data), project_root, submitted, class_counts)
    outcome = run_tracked(sweep, params, data, project_root)
    outcome.records = by_trial(outcome.records + sweep.reused)
    return outcome


def by_trial(records: list[TrialRecord]) -> list[TrialRecord]:
    """In the manifest's order: by variant, then seed."""
    return sorted(records, key=lambda r: (r.variant, r.seed))


def tune_manifest(outcome: TrackedOutcome) -> TuneManifest:
    """The tune stage's manifest of a sweep's outcome."""
    return TuneManifest(
        params_hash=outcome.name.removeprefix(f"{STAGE}-"),
        experiment_name=outcome.name,
        ray_experiment_path=str(outcome.path),
        metric=METRIC,
        mode=MODE,
        tracking_uri=outcome.parent.tracking_uri,
        experiment_id=outcome.parent.experiment_id,
        parent_run_id=outcome.parent.parent_run_id,
        trials=outcome.records,
    )


def reused_records(uri: str, decisions: list[TrialDecision], seen: dict[str, Any] | None = None) -> list[TrialRecord]:
    """The manifest's records of the reused trials, from their finished runs (those the plan read cost no request); the
    head-centre history from the Ray copy of the checkpoint, else the run's artifacts."""
    reused = [decision for decision in decisions if decision.action == REUSE]
    if not reused:
        return []
    store = Store(uri)
    records = []
    for decision in reused:
        run = (seen or {}).get(str(decision.run_id)) or store.run(str(decision.run_id))
        metrics = {**run.data.metrics, "epoch": decision.epoch}  # the latest value of each; the epoch is their step
        trial_id = run.data.tags.get(tags.TRIAL_ID_TAG, "")
        about = (run.info.run_id, run.info.run_name, run.data.tags)
        record = trial_record(
            trial_id, about, decision.variant, decision.seed, FINISHED, metrics, decision.checkpoint_dir
        )
        record.reused = True
        if decision.checkpoint_dir is not None:  # the Ray copy of the uploaded checkpoint folder
            history = StoragePath(decision.checkpoint_dir) / HEAD_HISTORY_FILE
            uploaded = [HEAD_HISTORY_FILE] if history.is_file() else []
        else:
            uploaded = store.artifact_names(run.info.run_id, "checkpoint")
        if HEAD_HISTORY_FILE in uploaded:  # listed even when the Ray copy of the checkpoint is gone
            record.artifacts["head_history"] = f"{record.artifacts['checkpoint']}/{HEAD_HISTORY_FILE}"
        records.append(record)
    return records


def publish_sweep(params: Params, data_hash: str, parent: ParentRun, trials: list[TrialRecord]) -> None:
    """The tune stage's summary on its parent run, once the sweep has finished (``registry.publish_summary``)."""
    data = params.data
    seeds = len(params.sweep.seeds)
    summary = SweepSummary(
        f"Sweep of {len(params.sweep.variants)} variants x {seeds} seed{'s' if seeds > 1 else ''}",
        f"{data.dataset} {data.image_size}x{data.image_size} (prepared data sha256 {data_hash[:12]})",
        params.train.epochs,
        accuracy_summary(trials),
    )
    Store(parent.tracking_uri).publish_summary(parent.parent_run_id, summary, trials)
