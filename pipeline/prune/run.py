"""Prune and fine-tune: each planned model is evaluated right after pruning, saved, and fine-tuned as a Ray Tune trial.

Fine-tuning runs the tracked-run sequence the sweep runs (``pipeline.sweep.tracked``), so it has the sweep's
guarantees: the same trainable (started from the pruned weights, ``init_from``), retries from checkpoints, restore
after Ctrl-C, GPU resources per trial, the MLflow outage buffer (flushed, parked; the stage exits 75 while writes
wait), interrupted runs closed. One MLflow child run per model under a ``prune-<hash>`` parent run in the sweep's
experiment. Each child run starts at step 0 with the accuracy right after pruning, so the MLflow UI shows the dip and
the recovery on one chart (the paper's Fig. 8), and carries the per-head decisions as a JSON artifact. The source run
is tagged with its pruned child. What is the prune stage's own: its decisions per pruned model (identity:
``prune_key``), evaluating and saving the models, linking sources and registering the best pruned models.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from torch import nn

from pipeline.config import AshaConfig, ModelConfig, Params, params_hash, parse_params
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.prune.manifest import STAGE, PrunedModel, PruneManifest
from pipeline.prune.plan import PrunePlan
from pipeline.sweep.identity import code_hash
from pipeline.sweep.manifest import FINISHED, INTERRUPTED, TrialRecord, TuneManifest
from pipeline.sweep.reuse import REUSE, TrialDecision, decide
from pipeline.sweep.run import trial_run_info
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracked import TrackedOutcome, TrackedStage, run_tracked
from pipeline.sweep.tracking.buffer import TrackingBuffer
from pipeline.sweep.tracking.callback import TrialInfo
from pipeline.sweep.tracking.logged_model import PreparedDataset
from pipeline.sweep.tracking.parent import ParentRun
from pipeline.sweep.tracking.registry import register_best_models
from pipeline.sweep.tracking.store import find_runs, mlflow_client
from pipeline.sweep.tracking.tags import KEY_TAG, NOTE_TAG, flatten, git_commit, parent_run_name
from pipeline.sweep.tuner import trial_config
from pipeline.trial.checkpoint import save_model_checkpoint
from pipeline.trial.device import resolve_device
from pipeline.trial.loop import DeviceData, evaluate

log = logging.getLogger(__name__)


@dataclass
class PruneOutcome:
    manifest: PruneManifest
    tracked: TrackedOutcome | None = None  # None: nothing to prune, no run

    @property
    def interrupted(self) -> bool:
        return self.tracked is not None and self.tracked.interrupted

    @property
    def failed(self) -> bool:
        return self.tracked is not None and self.tracked.failed


def finetune_params(params: Params) -> Params:
    """The sweep's params as the fine-tuning trials see them: lr x ``prune.lr_factor``, ``prune.epochs`` epochs, no
    ASHA (every pruned model trains to the end)."""
    return schedule_params(params, params.prune.lr_factor, params.prune.epochs)


def schedule_params(params: Params, lr_factor: float, epochs: int) -> Params:
    """The sweep's params for fine-tuning a model built from its trials (pruned, or transformed by
    ``pipeline.transform``): lr x ``lr_factor`` for ``epochs`` epochs, no ASHA (every model trains to the end)."""
    train = params.train.model_copy(update={"lr": params.train.lr * lr_factor, "epochs": epochs})
    sweep = params.sweep.model_copy(update={"asha": AshaConfig(enabled=False)})
    return parse_params(params.model_copy(update={"train": train, "sweep": sweep}).model_dump(mode="json"))


def prune_key(params: Params, plan: PrunePlan) -> str:
    """Identity of one pruned and fine-tuned model: its source trial's identity (model, train config with seed, data,
    trial code, which holds the pruning rule) and the prune config. A finished fine-tuning run of the same key is
    reused; a source without a key (a manifest written before trial keys) is named by its run and the trial code."""
    source = plan.source.trial_key or {"run": plan.source.run_id, "code": code_hash()}
    return params_hash({"source": source, "prune": params.prune.model_dump(mode="json")})


def prune_decisions(params: Params, tune_manifest: TuneManifest, plans: list[PrunePlan]) -> dict[str, TrialDecision]:
    """Per planned model (by ``PrunePlan.key``): reuse its finished fine-tuning run, resume an unfinished one, or
    train (``pipeline.sweep.reuse``), looked up in the sweep's MLflow experiment."""
    keys = {plan.key: prune_key(params, plan) for plan in plans}
    found = find_runs(mlflow_client(tune_manifest.tracking_uri), tune_manifest.experiment_id, keys.values())
    epochs = finetune_params(params).train.epochs
    retrain = params.sweep.retrain
    return {
        plan.key: decide(
            plan.source.variant, plan.source.seed, keys[plan.key], found[keys[plan.key]], epochs, retrain=retrain
        )
        for plan in plans
    }


def prune_name(keys: list[str]) -> str:
    """``prune-<hash>`` of the pruned models' keys: the Ray experiment and MLflow parent run of one prune run."""
    return f"{STAGE}-{params_hash({'models': sorted(keys)})}"


def finetune_run_info(
    config: dict[str, Any], params_json: dict[str, Any], data_hash: str, plans: dict[str, dict]
) -> TrialInfo:
    """The fine-tuning run of one pruned model: the trial's run info plus where it came from and what was cut; its
    ``trial_key`` is the pruned model's identity (``prune_key``)."""
    info = trial_run_info(config, params_json, data_hash)
    plan = plans[f"{config['variant']}-seed{config['seed']}"]
    per_layer = {f"prune.pruned_heads.layer{i + 1}": str(n) for i, n in enumerate(plan["pruned_heads"])}
    return TrialInfo(
        run_name=f"{info.run_name} pruned",
        params={
            **info.params,
            **per_layer,
            "prune.heads_per_layer": str(plan["heads_per_layer"]),
            "prune.source_run_id": plan["source_run_id"],
        },
        tags={
            **info.tags,
            KEY_TAG: plan["prune_key"],
            "source_run_id": plan["source_run_id"],
            "prune.pruned_heads": str(plan["pruned_heads"]),
            "prune.pruned_dir": plan["pruned_dir"],
            NOTE_TAG: pruned_note(plan),
        },
        start_metrics={"test_acc": plan["acc_after_pruning"], "test_loss": plan["loss_after_pruning"]},
        start_artifacts={"pruning_decisions.json": plan["decisions"]},
    )


def pruned_note(plan: dict[str, Any]) -> str:
    """The fine-tuning run's description (Markdown in the UI): which run it was pruned from, as a link, and what
    pruning cut."""
    source = f"#/experiments/{plan['source_experiment_id']}/runs/{plan['source_run_id']}"
    cut = sum(plan["pruned_heads"])
    return (
        f"Pruned from [{plan['source_run_name']}]({source}) (run `{plan['source_run_id']}`): {cut} of "
        f"{cut + sum(plan['heads_per_layer'])} heads cut (per layer {plan['pruned_heads']}), then fine-tuned. "
        f"Step 0 is the test accuracy right after pruning ({plan['acc_after_pruning']:.4f}); "
        "`pruning_decisions.json` holds each head's decision."
    )


def _evaluate(plan: PrunePlan, data: DeviceData, params: Params) -> tuple[float, float]:
    """Test loss and accuracy of the pruned model before any fine-tuning (the dip of Fig. 8)."""
    device = data.test_labels.device
    model = plan.model.to(device)
    loss, accuracy = evaluate(model, data.test_images, data.test_labels, data, params.train.eval_batch_size, None)
    plan.model = model.cpu()
    return loss, accuracy


class Prune(TrackedStage):
    """The prune stage's part of the tracked run: its decisions per pruned model, evaluating and saving the models
    that fine-tune, linking each source run to its pruned child, registering the best pruned models."""

    def __init__(
        self,
        params: Params,
        data: PreparedData,
        tune_manifest: TuneManifest,
        plans: list[PrunePlan],
        project_root: Path,
    ) -> None:
        self.params, self.data, self.tune_manifest, self.plans = params, data, tune_manifest, plans
        self.keys = {plan.key: prune_key(params, plan) for plan in plans}
        self.name, self.work = prune_name(list(self.keys.values())), "fine-tuning"
        self.run_name = parent_run_name(STAGE, params, project_root, self.name)
        self.tracking_uri = tune_manifest.tracking_uri
        client = mlflow_client(self.tracking_uri)
        self.experiment = client.get_experiment(tune_manifest.experiment_id).name
        commit = git_commit(project_root)
        self.tags = {"dvc_stage": STAGE, "params_hash": self.name.removeprefix(f"{STAGE}-"), "git_commit": commit}
        self.parent_tags = {"prune.source_sweep_run_id": tune_manifest.parent_run_id}
        self.rule = finetune_rule(params)
        self.parent_params = flatten({"prune": self.rule, "sources": len(plans)})
        self.tuner_params = finetune_params(params)
        self.data_hash = content_hash(data)
        self.dataset = PreparedDataset.of(params.data, self.data_hash, project_root)  # the fine-tuning's input
        self.summaries: dict[str, dict] = {}  # per model fine-tuned in this run: what pruning did (its run's info)
        self.reused: dict[str, PrunedModel] = {}  # per model reused: read from its finished fine-tuning run

    def decide(self, parent: ParentRun) -> list[TrialDecision]:
        return list(prune_decisions(self.params, self.tune_manifest, self.plans).values())

    def trials(self, decisions: list[TrialDecision], path: StoragePath) -> tuple[list[dict], Callable]:
        """Evaluate and save every model that fine-tunes (the dip right after pruning is its run's step 0); read the
        reused ones' runs now, while the server is known to answer."""
        by_plan = {f"{d.variant}-seed{d.seed}": d for d in decisions}
        client = mlflow_client(self.tracking_uri)
        self.reused = {
            p.key: _reused_model(p, client, by_plan[p.key]) for p in self.plans if by_plan[p.key].action == REUSE
        }
        to_train = [plan for plan in self.plans if plan.key not in self.reused]
        on_device = DeviceData.from_prepared(self.data, resolve_device(self.params.train)) if to_train else None
        trials = []
        for plan in to_train:
            loss, accuracy = _evaluate(plan, on_device, self.params)
            pruned_dir = path / "pruned" / plan.key  # where every node's fine-tuning trial reads it (init_from)
            _save_pruned(pruned_dir, plan, self.params)
            log.info(
                "%s: heads cut per layer %s; params %s -> %s; test acc %.4f -> %.4f right after pruning",
                plan.key,
                plan.pruned_heads,
                f"{plan.params_before:,}",
                f"{plan.params_after:,}",
                plan.source.metrics.get("test_acc", float("nan")),
                accuracy,
            )
            self.summaries[plan.key] = {
                "source_run_id": str(plan.source.run_id),
                "source_run_name": plan.source.run_name or plan.key,
                "source_experiment_id": self.tune_manifest.experiment_id,
                "pruned_heads": plan.pruned_heads,
                "heads_per_layer": plan.heads_per_layer,
                "acc_after_pruning": accuracy,
                "loss_after_pruning": loss,
                "decisions": plan.decisions,
                "pruned_dir": str(pruned_dir),
                "prune_key": self.keys[plan.key],
            }
            trials.append({**trial_config(by_plan[plan.key]), "init_from": str(pruned_dir)})
        run_info = functools.partial(
            finetune_run_info,
            params_json=self.tuner_params.model_dump(mode="json"),
            data_hash=self.data_hash,
            plans=self.summaries,
        )
        return trials, run_info

    def models(self, records: list[TrialRecord]) -> list[PrunedModel]:
        """Every planned model, fine-tuned in this run (from its record) or reused."""
        by_key = {f"{r.variant}-seed{r.seed}": r for r in records}
        models = [
            self.reused[plan.key]
            if plan.key in self.reused
            else _pruned_model(plan, self.summaries[plan.key], by_key.get(plan.key))
            for plan in self.plans
        ]
        for model in models:
            model.prune_key = self.keys[f"{model.variant}-seed{model.seed}"]
        return models

    def wrap_up(
        self, parent: ParentRun, decisions: list[TrialDecision], records: list[TrialRecord], buffer: TrackingBuffer
    ) -> dict[str, str]:
        models = self.models(records)
        for model in models:
            if model.run_id and model.source_run_id and not model.reused:
                buffer.set_tags(model.source_run_id, {"prune.child_run_id": model.run_id})
        if buffer.flush(force=True):  # the registry reads the runs; with the server down, the next run registers
            try:
                register_best_models(self.tracking_uri, self.experiment, records, suffix="_pruned")
            except MlflowException as err:
                log.warning("MLflow: could not register the pruned models: %s", err)
        return {"prune.models": str(len(models)), "prune.models_reused": str(sum(m.reused for m in models))}


def finetune_rule(params: Params) -> dict[str, Any]:
    """The prune section and the fine-tuning learning rate: the manifest's ``rule`` and the parent run's params."""
    return {**params.prune.model_dump(mode="json"), "finetune_lr": params.train.lr * params.prune.lr_factor}


def run_prune(
    params: Params,
    data: PreparedData,
    project_root: Path,
    tune_manifest: TuneManifest,
    plans: list[PrunePlan],
    skipped: list[dict[str, str]],
) -> PruneOutcome:
    """Fine-tune every planned model whose identity has no finished fine-tuning run yet (evaluated and saved first);
    the manifest names each model's fine-tuning run, reused or new."""
    if not plans:
        log.info("nothing to prune (no finished trial of %s)", params.prune_variants())
        empty = PruneManifest(
            "",
            "",
            tune_manifest.experiment_name,
            tune_manifest.tracking_uri,
            tune_manifest.experiment_id,
            "",
            finetune_rule(params),
            [],
            skipped,
        )
        return PruneOutcome(empty)
    prune = Prune(params, data, tune_manifest, plans, project_root)
    tracked = run_tracked(prune, params, data, project_root)
    manifest = PruneManifest(
        prune.name,
        str(tracked.path),
        tune_manifest.experiment_name,
        tune_manifest.tracking_uri,
        tune_manifest.experiment_id,
        tracked.parent.parent_run_id,
        prune.rule,
        prune.models(tracked.records),
        skipped,
    )
    return PruneOutcome(manifest, tracked)


def _save_pruned(where: StoragePath, plan: PrunePlan, params: Params) -> None:
    """The pruned model as a checkpoint folder at ``where`` (``save_start_checkpoint``)."""
    model_cfg = params.model_for(plan.source.variant)
    save_start_checkpoint(where, plan.model, model_cfg, image_shape=plan.image_shape, num_classes=plan.num_classes)


def save_start_checkpoint(
    where: StoragePath, model: nn.Module, model_cfg: ModelConfig, *, image_shape: tuple[int, int, int], num_classes: int
) -> None:
    """A model a fine-tuning trial starts from (``init_from``) as a checkpoint folder at ``where``: written in place,
    or staged on this disk and uploaded when the storage is a bucket."""

    def save(folder: Path) -> None:
        save_model_checkpoint(folder, model, model_cfg, image_shape=image_shape, num_classes=num_classes)

    if not where.remote:
        save(where.local)
        return
    with tempfile.TemporaryDirectory(prefix="start-") as staging:
        save(Path(staging))
        where.upload(Path(staging))


def _from_plan(plan: PrunePlan) -> dict[str, Any]:
    """What a pruned model's manifest entry takes from its plan, whether fine-tuned in this run or reused."""
    return {
        "source_run_id": str(plan.source.run_id),
        "source_trial_id": plan.source.trial_id,
        "variant": plan.source.variant,
        "seed": plan.source.seed,
        "pruned_heads": plan.pruned_heads,
        "heads_per_layer": plan.heads_per_layer,
        "params_before": plan.params_before,
        "params_after": plan.params_after,
        "flops_before": plan.flops_before,
        "flops_after": plan.flops_after,
        "acc_before_pruning": float(plan.source.metrics.get("test_acc", float("nan"))),
        "decisions": plan.decisions,
    }


def _reused_model(plan: PrunePlan, client: MlflowClient, decided: TrialDecision) -> PrunedModel:
    """A pruned model whose fine-tuning already finished in an earlier prune run: its figures come from that run (the
    accuracy right after pruning is its step-0 metric)."""
    run = client.get_run(str(decided.run_id))
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "test_acc")}
    metrics = {**run.data.metrics, "epoch": float(decided.epoch)}
    return PrunedModel(
        **_from_plan(plan),
        run_id=run.info.run_id,
        run_name=run.info.run_name,
        status=FINISHED,
        epochs_completed=decided.epoch,
        acc_after_pruning=history.get(0, float("nan")),
        acc_after_finetune=run.data.metrics.get("test_acc"),
        pruned_checkpoint_dir=run.data.tags.get("prune.pruned_dir", ""),
        checkpoint_dir=decided.checkpoint_dir,
        metrics=metrics,
        reused=True,
    )


def _pruned_model(plan: PrunePlan, summary: dict, record: TrialRecord | None) -> PrunedModel:
    """A pruned model fine-tuned in this run (``record``: its trial; None when it never started)."""
    metrics = record.metrics if record else {}
    return PrunedModel(
        **_from_plan(plan),
        run_id=record.run_id if record else None,
        run_name=record.run_name if record else None,
        status=record.status if record else INTERRUPTED,
        epochs_completed=record.epochs_completed if record else 0,
        acc_after_pruning=summary["acc_after_pruning"],
        acc_after_finetune=metrics.get("test_acc"),
        pruned_checkpoint_dir=summary["pruned_dir"],
        checkpoint_dir=record.checkpoint_dir if record else None,
        metrics=metrics,
    )
