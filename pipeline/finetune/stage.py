"""The fine-tune stages' driver: a recipe's planned models fine-tuned as tracked Ray Tune trials.

Each model is saved where every node reads it and fine-tuned through ``run_tracked`` (``init_from``), with the sweep's
guarantees: retries from checkpoints, restore after Ctrl-C, the MLflow outage buffer, interrupted runs closed; one
child run per model under a ``<stage>-<hash>`` parent in the sweep's experiment, whose step 0 is what the model
measured before fine-tuning (so the UI draws the dip and the recovery on one chart, the paper's Fig. 8). A model's
identity is its source trial's, the code of its rule and fine-tuning, and the recipe's config (``model_key``): a
finished run of it is reused, an unfinished one resumed.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from pipeline.config import ModelConfig, Params, params_hash
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.finetune.manifest import FineTuneManifest
from pipeline.finetune.plan import Plan, finetune_params
from pipeline.finetune.recipe import Recipe
from pipeline.sweep.identity import trial_code
from pipeline.sweep.manifest import FINISHED, INTERRUPTED, TrialRecord, TuneManifest
from pipeline.sweep.reuse import REUSE, TrialDecision, decide
from pipeline.sweep.run import trial_run_info
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracked import TrackedOutcome, TrackedStage, run_tracked
from pipeline.sweep.tracking import PreparedDataset, Store, TrialInfo, tags
from pipeline.sweep.tuner import trial_config
from pipeline.trial.checkpoint import save_model_checkpoint
from pipeline.trial.device import resolve_device
from pipeline.trial.device_data import DeviceData

log = logging.getLogger(__name__)


@dataclass
class FineTuneOutcome:
    manifest: FineTuneManifest
    tracked: TrackedOutcome | None = None  # None: nothing to fine-tune, no run

    @property
    def interrupted(self) -> bool:
        return self.tracked is not None and self.tracked.interrupted

    @property
    def failed(self) -> bool:
        return self.tracked is not None and self.tracked.failed


def source_identity(source: TrialRecord) -> Any:
    """The source trial's identity; one without a key (a manifest written before trial keys): its run."""
    return source.trial_key or {"run": source.run_id}


def finetune_code(params: Params, variant: str, rule: str) -> str:
    """The code a fine-tuned model's result depends on beyond its source trial's: the code its fine-tuning trial runs
    (a model of ``variant``) and the module of the rule that builds its start weights (``rule``, with its imports)."""
    model = params.model_for(variant)
    return trial_code(model.arch, model.encoding, also=(rule,))


def model_key(recipe: Recipe, params: Params, plan: Plan) -> str:
    """A built and fine-tuned model's identity: its source trial's, its rule's and fine-tuning's code, the recipe's."""
    source, code = source_identity(plan.source), finetune_code(params, plan.name, recipe.rule_module)
    return params_hash({"source": source, recipe.stage: recipe.identity(params, plan), "code": code})


def finetune_rule(recipe: Recipe, params: Params) -> dict[str, Any]:
    """The recipe's section and the fine-tuning learning rate: the manifest's ``rule`` and the parent run's params."""
    section = getattr(params, recipe.stage)
    return {**section.model_dump(mode="json"), "finetune_lr": params.train.lr * section.lr_factor}


def finetune_name(stage: str, keys: list[str]) -> str:
    """``<stage>-<hash>`` of the fine-tuned models' keys: the Ray experiment and MLflow parent run of one run."""
    return f"{stage}-{params_hash({'models': sorted(keys)})}"


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


def reused_fields(run: Any, decided: TrialDecision) -> dict[str, Any]:
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


def run_info(
    config: dict[str, Any], params_json: dict[str, Any], data_hash: str, plans: dict[str, dict], recipe: Recipe
) -> TrialInfo:
    """The fine-tuning run of one model: the trial's run info, where the model came from and what the recipe did
    (``Recipe.start``); its ``trial_key`` is the model's identity. Module-level: Tune pickles the callback."""
    info = trial_run_info(config, params_json, data_hash)
    plan = plans[f"{config['variant']}-seed{config['seed']}"]
    return TrialInfo(
        run_name=info.run_name + recipe.run_suffix,
        params={**info.params, **plan["params"], f"{recipe.stage}.source_run_id": plan["source_run_id"]},
        tags={
            **info.tags,
            tags.KEY_TAG: plan["key"],
            "source_run_id": plan["source_run_id"],
            **plan["tags"],
            f"{recipe.stage}.{recipe.start_folder}_dir": plan["start_dir"],
            tags.NOTE_TAG: recipe.note(plan),
        },
        start_metrics=plan["metrics"],
        start_artifacts=plan["artifacts"],
    )


def decisions(
    recipe: Recipe, params: Params, tune_manifest: TuneManifest, plans: list[Plan]
) -> dict[str, TrialDecision]:
    """Per plan key: reuse its finished fine-tuning run, resume an unfinished one, or train (``pipeline.sweep.reuse``),
    looked up in the sweep's MLflow experiment (also what ``--dry-run`` prints)."""
    keys = {plan.key: model_key(recipe, params, plan) for plan in plans}
    found = Store(tune_manifest.tracking_uri).find_runs(tune_manifest.experiment_id, keys.values())
    epochs, retrain = finetune_params(recipe, params).train.epochs, params.sweep.retrain
    return {
        p.key: decide(p.name, p.source.seed, keys[p.key], found[keys[p.key]], epochs, retrain=retrain) for p in plans
    }


class FineTune(TrackedStage):
    """A recipe's fine-tuning as ``run_tracked`` runs it: identity, decisions, the start weights saved, the manifest's
    entries, the links from each source run to its child."""

    def __init__(
        self,
        recipe: Recipe,
        params: Params,
        data: PreparedData,
        tune_manifest: TuneManifest,
        plans: list[Plan],
        root: Path,
    ) -> None:
        self.recipe, self.params, self.data, self.tune_manifest, self.plans = recipe, params, data, tune_manifest, plans
        self.keys = {plan.key: model_key(recipe, params, plan) for plan in plans}
        self.name, self.work = finetune_name(recipe.stage, list(self.keys.values())), "fine-tuning"
        self.run_name = tags.parent_run_name(recipe.stage, params, root, self.name)
        self.store = Store(tune_manifest.tracking_uri)
        self.tracking_uri, self.experiment = self.store.uri, self.store.experiment_name(tune_manifest.experiment_id)
        commit = tags.git_commit(root)
        self.tags = {"dvc_stage": recipe.stage, "params_hash": self.name.split("-", 1)[1], "git_commit": commit}
        self.parent_tags = {f"{recipe.stage}.source_sweep_run_id": tune_manifest.parent_run_id}
        self.rule = finetune_rule(recipe, params)
        self.parent_params = tags.flatten({recipe.stage: self.rule, "sources": len(plans)})
        self.tuner_params = finetune_params(recipe, params)
        self.data_hash = content_hash(data)
        self.dataset = PreparedDataset.of(params.data, self.data_hash, root)  # the fine-tuning's input
        self.summaries: dict[str, dict] = {}  # per model fine-tuned in this run: what its run describes
        self.reused: dict[str, Any] = {}  # per model reused: its manifest entry, read from its finished run
        self.on_device: DeviceData | None = None

    def device_data(self) -> DeviceData:
        """The test set on the fine-tuning's device, moved there once."""
        if self.on_device is None:
            self.on_device = DeviceData.from_prepared(self.data, resolve_device(self.params.train))
        return self.on_device

    def decide(self, parent: Any) -> list[TrialDecision]:
        return list(decisions(self.recipe, self.params, self.tune_manifest, self.plans).values())

    def trials(self, decided: list[TrialDecision], path: StoragePath) -> tuple[list[dict], Callable]:
        """Save every model that fine-tunes where every node's trial reads it (``init_from``); read the reused ones'
        runs now, while the server is known to answer."""
        recipe, by_plan = self.recipe, {f"{d.variant}-seed{d.seed}": d for d in decided}
        start_tag = f"{recipe.stage}.{recipe.start_folder}_dir"
        for plan in (p for p in self.plans if by_plan[p.key].action == REUSE):
            found = by_plan[plan.key]
            run, step0 = self.store.finished_run(str(found.run_id), recipe.step0_metric)
            fields = {**reused_fields(run, found), "start_dir": run.data.tags.get(start_tag, ""), "step0": step0}
            self.reused[plan.key] = recipe.entry_of(plan, {**fields, "key": self.keys[plan.key]})
        trials = []
        for plan in (p for p in self.plans if p.key not in self.reused):
            summary = {"params": {}, "tags": {}, "artifacts": {}, **recipe.start(self.params, plan, self.device_data)}
            start_dir = path / recipe.start_folder / plan.key
            shape, classes, model_cfg = plan.image_shape, plan.num_classes, self.params.model_for(plan.name)
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
            run_info, params_json=params_json, data_hash=self.data_hash, plans=self.summaries, recipe=recipe
        )

    def models(self, records: list[TrialRecord]) -> list[Any]:
        """Every planned model's entry, fine-tuned in this run (from its record) or reused."""
        by_key, entries = {f"{r.variant}-seed{r.seed}": r for r in records}, []
        for plan in self.plans:
            if plan.key in self.reused:
                entries.append(self.reused[plan.key])
                continue
            summary = self.summaries[plan.key]
            step0 = summary["metrics"].get(self.recipe.step0_metric) if self.recipe.step0_metric else None
            run = {**trained_fields(by_key.get(plan.key)), "start_dir": summary["start_dir"], "step0": step0}
            entries.append(self.recipe.entry_of(plan, {**run, "reused": False, "key": summary["key"]}))
        return entries

    def wrap_up(
        self, parent: Any, decided: list[TrialDecision], records: list[TrialRecord], buffer: Any
    ) -> dict[str, str]:
        models, stage = self.models(records), self.recipe.stage
        for model in models:
            if model.run_id and model.source_run_id and not model.reused:
                buffer.set_tags(model.source_run_id, {f"{stage}.child_run_id": model.run_id})
        suffix = self.recipe.register_suffix
        if suffix is not None and buffer.flush(force=True):  # the registry reads the runs; down: the next run does
            self.store.register_best_models(self.experiment, records, suffix=suffix)
        reused = sum(m.reused for m in models)
        return {f"{stage}.models": str(len(models)), f"{stage}.models_reused": str(reused)}


def run_finetune(
    recipe: Recipe,
    params: Params,
    data: PreparedData,
    root: Path,
    tune_manifest: TuneManifest,
    plans: list[Plan],
    skipped: list[dict[str, str]] | None,
) -> FineTuneOutcome:
    """Fine-tune every planned model whose identity has no finished fine-tuning run yet (started and saved first);
    the manifest names each model's fine-tuning run, reused or new."""
    where = (tune_manifest.experiment_name, tune_manifest.tracking_uri, tune_manifest.experiment_id)
    rule = finetune_rule(recipe, params)
    if not plans:
        log.info(recipe.nothing(params))
        return FineTuneOutcome(FineTuneManifest("", "", *where, "", rule, [], skipped, stage=recipe.stage))
    stage = FineTune(recipe, params, data, tune_manifest, plans, root)
    tracked = run_tracked(stage, params, data, root)
    models = stage.models(tracked.records)
    name, parent = stage.name, tracked.parent.parent_run_id
    manifest = FineTuneManifest(name, str(tracked.path), *where, parent, rule, models, skipped, stage=recipe.stage)
    return FineTuneOutcome(manifest, tracked)
