"""Prune and fine-tune: each planned model is evaluated right after pruning, saved, and fine-tuned as a Ray Tune trial.

Fine-tuning is ``pipeline.sweep.finetune``'s. Each pruned model's run starts at step 0 with the accuracy right after
pruning, so the MLflow UI shows the dip and the recovery on one chart (the paper's Fig. 8), and carries the per-head
decisions as a JSON artifact. The prune stage's own: its identity per pruned model (``prune_key``), the evaluation
right after pruning, its run's description, registering the best pruned models.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.config import Params, params_hash
from pipeline.data.prepared import PreparedData
from pipeline.prune.manifest import STAGE, PrunedModel, PruneManifest
from pipeline.prune.plan import PrunePlan
from pipeline.sweep.finetune import (
    FineTuneOutcome,
    FineTuneStage,
    finetune_code,
    reused_fields,
    schedule_params,
    source_identity,
    trained_fields,
)
from pipeline.sweep.manifest import TrialRecord, TuneManifest
from pipeline.sweep.reuse import TrialDecision
from pipeline.sweep.run import trial_run_info
from pipeline.sweep.tracked import run_tracked
from pipeline.sweep.tracking.buffer import TrackingBuffer
from pipeline.sweep.tracking.callback import TrialInfo
from pipeline.sweep.tracking.registry import register_best_models
from pipeline.sweep.tracking.store import Run
from pipeline.sweep.tracking.tags import KEY_TAG, NOTE_TAG
from pipeline.trial.device import resolve_device
from pipeline.trial.loop import DeviceData, evaluate

log = logging.getLogger(__name__)


def finetune_params(params: Params) -> Params:
    """The sweep's params as the fine-tuning trials see them: lr x ``prune.lr_factor``, ``prune.epochs`` epochs, no
    ASHA (every pruned model trains to the end)."""
    return schedule_params(params, params.prune.lr_factor, params.prune.epochs)


def prune_key(params: Params, plan: PrunePlan) -> str:
    """Identity of one pruned and fine-tuned model: its source trial's identity, the code of the pruning rule and of
    its fine-tuning, and the prune config. A finished fine-tuning run of the same key is reused."""
    code = finetune_code(params, plan.source.variant, "pipeline.models.pruning")
    prune = params.prune.model_dump(mode="json")
    return params_hash({"source": source_identity(plan.source), "prune": prune, "code": code})


def finetune_rule(params: Params) -> dict[str, Any]:
    """The prune section and the fine-tuning learning rate: the manifest's ``rule`` and the parent run's params."""
    return {**params.prune.model_dump(mode="json"), "finetune_lr": params.train.lr * params.prune.lr_factor}


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
            KEY_TAG: plan["key"],
            "source_run_id": plan["source_run_id"],
            "prune.pruned_heads": str(plan["pruned_heads"]),
            "prune.pruned_dir": plan["start_dir"],
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


class Prune(FineTuneStage):
    """The prune stage's part of the fine-tuning: its identity per pruned model, evaluating each model right after
    pruning (the dip of Fig. 8, its run's step 0), registering the best pruned models."""

    stage, start_folder, step0_metric = STAGE, "pruned", "test_acc"
    describe_run, key = staticmethod(finetune_run_info), staticmethod(prune_key)
    schedule, rule_of = staticmethod(finetune_params), staticmethod(finetune_rule)
    variant = staticmethod(lambda plan: plan.source.variant)
    on_device: DeviceData | None = None  # the test set on the fine-tuning's device, once a model is evaluated

    def start(self, plan: PrunePlan) -> dict[str, Any]:
        """Test loss and accuracy of the pruned model before any fine-tuning (the dip of Fig. 8)."""
        if self.on_device is None:
            self.on_device = DeviceData.from_prepared(self.data, resolve_device(self.params.train))
        data = self.on_device
        model = plan.model.to(data.test_labels.device)
        loss, accuracy = evaluate(
            model, data.test_images, data.test_labels, data, self.params.train.eval_batch_size, None
        )
        plan.model = model.cpu()
        log.info(
            "%s: heads cut per layer %s; params %s -> %s; test acc %.4f -> %.4f right after pruning",
            plan.key,
            plan.pruned_heads,
            f"{plan.params_before:,}",
            f"{plan.params_after:,}",
            plan.source.metrics.get("test_acc", float("nan")),
            accuracy,
        )
        return {
            "pruned_heads": plan.pruned_heads,
            "heads_per_layer": plan.heads_per_layer,
            "acc_after_pruning": accuracy,
            "loss_after_pruning": loss,
            "decisions": plan.decisions,
        }

    def new_model(self, plan: PrunePlan, summary: dict[str, Any], record: TrialRecord | None) -> PrunedModel:
        fields = trained_fields(record)
        return PrunedModel(
            **_from_plan(plan),
            **fields,
            acc_after_pruning=summary["acc_after_pruning"],
            acc_after_finetune=fields["metrics"].get("test_acc"),
            pruned_checkpoint_dir=summary["start_dir"],
            prune_key=self.keys[plan.key],
        )

    def reused_model(self, plan: PrunePlan, run: Run, step0: float | None, decided: TrialDecision) -> PrunedModel:
        """The accuracy right after pruning is the reused run's step-0 metric."""
        return PrunedModel(
            **_from_plan(plan),
            **reused_fields(run, decided),
            acc_after_pruning=float("nan") if step0 is None else step0,
            acc_after_finetune=run.data.metrics.get("test_acc"),
            pruned_checkpoint_dir=run.data.tags.get("prune.pruned_dir", ""),
            prune_key=self.keys[plan.key],
        )

    def closing(self, records: list[TrialRecord], buffer: TrackingBuffer) -> None:
        if buffer.flush(force=True):  # the registry reads the runs; with the server down, the next run registers
            register_best_models(self.tracking_uri, self.experiment, records, suffix="_pruned")


def run_prune(
    params: Params,
    data: PreparedData,
    project_root: Path,
    tune_manifest: TuneManifest,
    plans: list[PrunePlan],
    skipped: list[dict[str, str]],
) -> FineTuneOutcome:
    """Fine-tune every planned model whose identity has no finished fine-tuning run yet (evaluated and saved first);
    the manifest names each model's fine-tuning run, reused or new."""
    where = (tune_manifest.experiment_name, tune_manifest.tracking_uri, tune_manifest.experiment_id)
    if not plans:
        log.info("nothing to prune (no finished trial of %s)", params.prune_variants())
        return FineTuneOutcome(PruneManifest("", "", *where, "", finetune_rule(params), [], skipped))
    prune = Prune(params, data, tune_manifest, plans, project_root)
    tracked = run_tracked(prune, params, data, project_root)
    models = prune.models(tracked.records)
    manifest = PruneManifest(
        prune.name, str(tracked.path), *where, tracked.parent.parent_run_id, prune.rule, models, skipped
    )
    return FineTuneOutcome(manifest, tracked)


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
