"""Fine-tuning models built from the tune stage's runs: what the prune and transform stages share.

Both build a model from some finished trials of the sweep (prune: heads cut; transform: Theorem 1's rebuild), save it
where every node reads it and fine-tune it through ``run_tracked`` (``init_from``), with the sweep's guarantees: one
child run per model under a ``<stage>-<hash>`` parent, whose step 0 is what the model measured before fine-tuning; a
model's identity is its source trial's, the code of its fine-tuning and of the rule that builds it
(``finetune_code``) and the stage's config (a finished run of it is reused, an unfinished one
resumed). Each stage gives its config, what it does to a model, its run's description and its manifest entry.
"""

from __future__ import annotations

import functools
import tempfile
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from pipeline.config import AshaConfig, ModelConfig, Params, params_hash, parse_params
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.sweep.identity import trial_code
from pipeline.sweep.manifest import FINISHED, INTERRUPTED, TrialRecord, TuneManifest
from pipeline.sweep.reuse import REUSE, TrialDecision, decide
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracked import TrackedOutcome, TrackedStage
from pipeline.sweep.tracking.buffer import TrackingBuffer
from pipeline.sweep.tracking.logged_model import PreparedDataset
from pipeline.sweep.tracking.parent import ParentRun
from pipeline.sweep.tracking.store import Run, experiment_name, find_runs, finished_run, mlflow_client
from pipeline.sweep.tracking.tags import flatten, git_commit, parent_run_name
from pipeline.sweep.tuner import trial_config
from pipeline.trial.checkpoint import save_model_checkpoint


@dataclass
class FineTuneOutcome:
    manifest: Any  # the stage's manifest (PruneManifest, TransformManifest)
    tracked: TrackedOutcome | None = None  # None: nothing to fine-tune, no run

    @property
    def interrupted(self) -> bool:
        return self.tracked is not None and self.tracked.interrupted

    @property
    def failed(self) -> bool:
        return self.tracked is not None and self.tracked.failed


def schedule_params(params: Params, lr_factor: float, epochs: int) -> Params:
    """The sweep's params for fine-tuning a model built from its trials: lr x ``lr_factor`` for ``epochs`` epochs, no
    ASHA (every model trains to the end). A variant with its own ``train.lr`` fine-tunes at that lr x ``lr_factor``."""
    train = params.train.model_copy(update={"lr": params.train.lr * lr_factor, "epochs": epochs})
    sweep = params.sweep.model_copy(update={"asha": AshaConfig(enabled=False)})
    dumped = params.model_copy(update={"train": train, "sweep": sweep}).model_dump(mode="json")
    for variant in dumped["variants"].values():
        if "train.lr" in variant:
            variant["train.lr"] *= lr_factor
    return parse_params(dumped)


def source_identity(source: TrialRecord) -> Any:
    """The source trial's identity; one without a key (a manifest written before trial keys): its run."""
    return source.trial_key or {"run": source.run_id}


def finetune_code(params: Params, variant: str, rule: str) -> str:
    """The code a fine-tuned model's result depends on beyond its source trial's: the code its fine-tuning trial runs
    (a model of ``variant``) and the module of the rule that builds its start weights (``rule``, with its imports)."""
    model = params.model_for(variant)
    return trial_code(model.arch, model.encoding, also=(rule,))


def save_start_checkpoint(
    where: StoragePath, model: nn.Module, model_cfg: ModelConfig, *, image_shape: tuple[int, int, int], num_classes: int
) -> None:
    """A model a fine-tuning trial starts from (``init_from``) as a checkpoint folder at ``where``: written in place,
    or staged on this disk and uploaded when the storage is a bucket."""
    with tempfile.TemporaryDirectory(prefix="start-") as staging:
        folder = Path(staging) if where.remote else where.local
        save_model_checkpoint(folder, model, model_cfg, image_shape=image_shape, num_classes=num_classes)
        if where.remote:
            where.upload(folder)


def trained_fields(record: TrialRecord | None) -> dict[str, Any]:
    """What a model's manifest entry takes from its fine-tuning trial (``record``; None: it never started)."""
    names = ("run_id", "run_name", "status", "epochs_completed", "checkpoint_dir", "metrics")
    never = {"status": INTERRUPTED, "epochs_completed": 0, "metrics": {}}
    return {name: getattr(record, name) if record else never.get(name) for name in names}


def reused_fields(run: Run, decided: TrialDecision) -> dict[str, Any]:
    """What a model's manifest entry takes from its finished fine-tuning run of an earlier stage run."""
    return {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": FINISHED,
        "epochs_completed": decided.epoch,
        "checkpoint_dir": decided.checkpoint_dir,
        "metrics": {**run.data.metrics, "epoch": float(decided.epoch)},
        "reused": True,
    }


class FineTuneStage(TrackedStage):
    """A stage that fine-tunes models built from the sweep's trials: identity, decisions, saving the start weights,
    the manifest's model entries and the links from each source run to its child. ``plans`` each have ``key``
    (``<variant>-seed<k>``), ``source`` (a ``TrialRecord``), ``model``, ``image_shape`` and ``num_classes``."""

    stage: str  # "prune" | "transform": the parent run's name and the tags' prefix
    start_folder: str  # where in the Ray experiment the start weights go: <start_folder>/<plan key>
    step0_metric: str | None = None  # a reused run's metric read back at step 0 (``reused_model``'s ``step0``)
    # Each stage's own, as static functions: (config, params_json, data_hash, plans) -> TrialInfo, module-level as
    # Tune pickles the callback that holds it; the identity (``source_identity`` and the stage's config); the variant
    # a plan's model trains as; the params the fine-tuning runs with (``schedule_params``); the stage's ``rule``.
    describe_run: Callable[..., Any]
    key: Callable[[Params, Any], str]
    variant: Callable[[Any], str]
    schedule: Callable[[Params], Params]
    rule_of: Callable[[Params], dict[str, Any]]

    def __init__(
        self, params: Params, data: PreparedData, tune_manifest: TuneManifest, plans: list[Any], project_root: Path
    ) -> None:
        self.params, self.data, self.tune_manifest, self.plans = params, data, tune_manifest, plans
        self.keys = {plan.key: self.key(params, plan) for plan in plans}
        self.name, self.work = finetune_name(self.stage, list(self.keys.values())), "fine-tuning"
        self.run_name = parent_run_name(self.stage, params, project_root, self.name)
        self.tracking_uri = tune_manifest.tracking_uri
        self.experiment = experiment_name(self.tracking_uri, tune_manifest.experiment_id)
        commit = git_commit(project_root)
        self.tags = {"dvc_stage": self.stage, "params_hash": self.name.split("-", 1)[1], "git_commit": commit}
        self.parent_tags = {f"{self.stage}.source_sweep_run_id": tune_manifest.parent_run_id}
        self.rule = self.rule_of(params)
        self.parent_params = flatten({self.stage: self.rule, "sources": len(plans)})
        self.tuner_params = self.schedule(params)
        self.data_hash = content_hash(data)
        self.dataset = PreparedDataset.of(params.data, self.data_hash, project_root)  # the fine-tuning's input
        self.summaries: dict[str, dict] = {}  # per model fine-tuned in this run: what its run describes
        self.reused: dict[str, Any] = {}  # per model reused: its manifest entry, read from its finished run

    @abstractmethod
    def start(self, plan: Any) -> dict[str, Any]:
        """Before the model is saved: what its run describes (merged into its summary), e.g. its accuracy now."""

    @abstractmethod
    def new_model(self, plan: Any, summary: dict[str, Any], record: TrialRecord | None) -> Any:
        """The manifest entry of a model fine-tuned in this run (``trained_fields``)."""

    @abstractmethod
    def reused_model(self, plan: Any, run: Run, step0: float | None, decided: TrialDecision) -> Any:
        """The manifest entry of a model whose fine-tuning finished in an earlier run (``reused_fields``)."""

    @classmethod
    def decisions(cls, params: Params, tune_manifest: TuneManifest, plans: list[Any]) -> dict[str, TrialDecision]:
        """Per plan key: reuse its finished fine-tuning run, resume an unfinished one, or train
        (``pipeline.sweep.reuse``), looked up in the sweep's MLflow experiment (also what ``--dry-run`` prints)."""
        keys = {plan.key: cls.key(params, plan) for plan in plans}
        found = find_runs(mlflow_client(tune_manifest.tracking_uri), tune_manifest.experiment_id, keys.values())
        epochs, retrain = cls.schedule(params).train.epochs, params.sweep.retrain
        return {
            p.key: decide(cls.variant(p), p.source.seed, keys[p.key], found[keys[p.key]], epochs, retrain=retrain)
            for p in plans
        }

    def closing(self, records: list[TrialRecord], buffer: TrackingBuffer) -> None:
        """After the links are written: anything else the stage publishes (prune registers its best models)."""

    def decide(self, parent: ParentRun) -> list[TrialDecision]:
        return list(self.decisions(self.params, self.tune_manifest, self.plans).values())

    def trials(self, decisions: list[TrialDecision], path: StoragePath) -> tuple[list[dict], Callable]:
        """Save every model that fine-tunes where every node's trial reads it (``init_from``); read the reused ones'
        runs now, while the server is known to answer."""
        by_plan = {f"{d.variant}-seed{d.seed}": d for d in decisions}
        for plan in (p for p in self.plans if by_plan[p.key].action == REUSE):
            decided = by_plan[plan.key]
            self.reused[plan.key] = self.reused_model(
                plan, *finished_run(self.tracking_uri, str(decided.run_id), self.step0_metric), decided
            )
        trials = []
        for plan in (p for p in self.plans if p.key not in self.reused):
            summary = self.start(plan)
            start_dir = path / self.start_folder / plan.key
            model_cfg = self.params.model_for(self.variant(plan))
            shape, classes = plan.image_shape, plan.num_classes
            save_start_checkpoint(start_dir, plan.model, model_cfg, image_shape=shape, num_classes=classes)
            self.summaries[plan.key] = {
                **summary,
                "source_run_id": str(plan.source.run_id),
                "source_run_name": plan.source.run_name or plan.key,
                "source_experiment_id": self.tune_manifest.experiment_id,
                "start_dir": str(start_dir),
                "key": self.keys[plan.key],
            }
            trials.append({**trial_config(by_plan[plan.key]), "init_from": str(start_dir)})
        params_json = self.tuner_params.model_dump(mode="json")
        return trials, functools.partial(
            self.describe_run, params_json=params_json, data_hash=self.data_hash, plans=self.summaries
        )

    def models(self, records: list[TrialRecord]) -> list[Any]:
        """Every planned model, fine-tuned in this run (from its record) or reused."""
        by_key = {f"{r.variant}-seed{r.seed}": r for r in records}
        return [
            self.reused.get(p.key) or self.new_model(p, self.summaries[p.key], by_key.get(p.key)) for p in self.plans
        ]

    def wrap_up(
        self, parent: ParentRun, decisions: list[TrialDecision], records: list[TrialRecord], buffer: TrackingBuffer
    ) -> dict[str, str]:
        models = self.models(records)
        for model in models:
            if model.run_id and model.source_run_id and not model.reused:
                buffer.set_tags(model.source_run_id, {f"{self.stage}.child_run_id": model.run_id})
        self.closing(records, buffer)
        reused = sum(m.reused for m in models)
        return {f"{self.stage}.models": str(len(models)), f"{self.stage}.models_reused": str(reused)}


def finetune_name(stage: str, keys: list[str]) -> str:
    """``<stage>-<hash>`` of the fine-tuned models' keys: the Ray experiment and MLflow parent run of one run."""
    return f"{stage}-{params_hash({'models': sorted(keys)})}"
