"""Fine-tune each converted network as a Ray Tune trial, through the fine-tuning the prune stage runs.

The same guarantees as the prune stage's fine-tuning, by the same code (``pipeline.sweep.finetune``): the sweep's
trainable started from the converted weights (``init_from``), retries from checkpoints, restore after Ctrl-C, the
MLflow outage buffer, interrupted runs closed; a finished fine-tuning of the same identity (``transform_key``) is
reused. One MLflow child run per network under a ``transform-<hash>`` parent run in the sweep's experiment; step 0 of
its ``test_acc`` is the accuracy before any training (the source's, by Theorem 1), so the UI draws the fine-tuning
from there; the trial records per-epoch locality and head histories as for any Gaussian-attention model. What is this
stage's own: its identity per network and its run's description.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.config import Params, params_hash
from pipeline.data.prepared import PreparedData
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
from pipeline.sweep.tracking.callback import TrialInfo
from pipeline.sweep.tracking.store import Run
from pipeline.sweep.tracking.tags import KEY_TAG, NOTE_TAG
from pipeline.transform.manifest import STAGE, TransformedModel, TransformManifest
from pipeline.transform.plan import TransformPlan

log = logging.getLogger(__name__)


def finetune_params(params: Params) -> Params:
    """The sweep's params as the fine-tuning trials see them: lr x ``transform.lr_factor``, ``transform.epochs``."""
    return schedule_params(params, params.transform.lr_factor, params.transform.epochs)


def transform_key(params: Params, plan: TransformPlan) -> str:
    """Identity of one converted and fine-tuned network: its source trial's identity, the code of the conversion and
    of its fine-tuning, its name and the transform config (epochs, lr factor)."""
    rule = params.transform.model_dump(mode="json", exclude={"variants"})
    code = finetune_code(params, plan.name, "pipeline.models.transformed_resnet")
    return params_hash({"source": source_identity(plan.source), "transform": {**rule, "name": plan.name}, "code": code})


def transform_rule(params: Params) -> dict[str, Any]:
    """The transform section and the fine-tuning learning rate: the manifest's ``rule`` and the parent's params."""
    return {**params.transform.model_dump(mode="json"), "finetune_lr": params.train.lr * params.transform.lr_factor}


def transform_run_info(
    config: dict[str, Any], params_json: dict[str, Any], data_hash: str, plans: dict[str, dict]
) -> TrialInfo:
    """The fine-tuning run of one converted network: the trial's run info, where it came from and how exact the
    conversion was (its step-0 metrics); its ``trial_key`` is ``transform_key``."""
    info = trial_run_info(config, params_json, data_hash)
    plan = plans[f"{config['variant']}-seed{config['seed']}"]
    exact = plan["exactness"]
    return TrialInfo(
        run_name=info.run_name,
        params={**info.params, "transform.source_run_id": plan["source_run_id"], "transform.alpha": exact["alpha"]},
        tags={
            **info.tags,
            KEY_TAG: plan["key"],
            "source_run_id": plan["source_run_id"],
            "transform.converted_dir": plan["start_dir"],
            NOTE_TAG: transformed_note(plan),
        },
        start_metrics={
            "test_acc": exact["test_acc_step0"],
            "test_loss": exact["test_loss_step0"],
            "test_acc_step0": exact["test_acc_step0"],
            "source_test_acc": exact["source_test_acc"],
            "max_logit_diff_float32": exact["max_logit_diff_float32"],
            "max_logit_diff_float64": exact["max_logit_diff_float64"],
        },
    )


def transformed_note(plan: dict[str, Any]) -> str:
    """The fine-tuning run's description (Markdown in the UI)."""
    source = f"#/experiments/{plan['source_experiment_id']}/runs/{plan['source_run_id']}"
    exact = plan["exactness"]
    return (
        f"[{plan['source_run_name']}]({source}) rebuilt as attention (Theorem 1: each 3x3 convolution a 9-head "
        f"quadratic attention layer), then fine-tuned. Step 0 is its test accuracy before any training "
        f"({exact['test_acc_step0']:.4f}, the source's {exact['source_test_acc']:.4f}); largest logit difference "
        f"{exact['max_logit_diff_float32']:.2g} in float32, {exact['max_logit_diff_float64']:.2g} in float64."
    )


class Transform(FineTuneStage):
    """The transform stage's part of the fine-tuning: its identity per network and its run's description."""

    stage, start_folder = STAGE, "converted"
    describe_run = staticmethod(transform_run_info)
    key = staticmethod(transform_key)
    schedule = staticmethod(finetune_params)

    variant = staticmethod(lambda plan: plan.name)
    rule_of = staticmethod(transform_rule)

    def start(self, plan: TransformPlan) -> dict[str, Any]:
        return {"exactness": plan.exactness}  # checked by the stage before any run (``plan.check_exact``)

    def new_model(self, plan: TransformPlan, summary: dict[str, Any], record: TrialRecord | None) -> TransformedModel:
        fields = trained_fields(record)
        return TransformedModel(
            **_from_plan(plan),
            **fields,
            test_acc=fields["metrics"].get("test_acc"),
            converted_checkpoint_dir=summary["start_dir"],
            transform_key=self.keys[plan.key],
        )

    def reused_model(
        self, plan: TransformPlan, run: Run, step0: float | None, decided: TrialDecision
    ) -> TransformedModel:
        return TransformedModel(
            **_from_plan(plan),
            **reused_fields(run, decided),
            test_acc=run.data.metrics.get("test_acc"),
            converted_checkpoint_dir=run.data.tags.get("transform.converted_dir", ""),
            transform_key=self.keys[plan.key],
        )


def run_transform(
    params: Params, data: PreparedData, project_root: Path, tune_manifest: TuneManifest, plans: list[TransformPlan]
) -> FineTuneOutcome:
    """Fine-tune every checked network whose identity has no finished fine-tuning run yet; the manifest names each
    network's fine-tuning run, reused or new."""
    where = (tune_manifest.experiment_name, tune_manifest.tracking_uri, tune_manifest.experiment_id)
    if not plans:
        log.info("nothing to transform (transform.variants is empty)")
        return FineTuneOutcome(TransformManifest("", "", *where, "", {}, []))
    stage = Transform(params, data, tune_manifest, plans, project_root)
    tracked = run_tracked(stage, params, data, project_root)
    models = stage.models(tracked.records)
    return FineTuneOutcome(
        TransformManifest(stage.name, str(tracked.path), *where, tracked.parent.parent_run_id, stage.rule, models),
        tracked,
    )


def _from_plan(plan: TransformPlan) -> dict[str, Any]:
    """What a network's manifest entry takes from its plan, whether fine-tuned in this run or reused."""
    exact = plan.exactness
    return {
        "name": plan.name,
        "source_variant": plan.source.variant,
        "source_run_id": str(plan.source.run_id),
        "source_trial_id": plan.source.trial_id,
        "seed": plan.source.seed,
        "converted_layers": list(plan.model.converted),
        "source_test_acc": exact["source_test_acc"],
        "test_acc_step0": exact["test_acc_step0"],
        "max_logit_diff_float32": exact["max_logit_diff_float32"],
        "max_logit_diff_float64": exact["max_logit_diff_float64"],
        "params_source": plan.params_source,
        "params": plan.params,
        "flops_source": plan.flops_source,
        "flops": plan.flops,
    }
