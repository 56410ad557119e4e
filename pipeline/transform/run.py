"""Fine-tune each converted network as a Ray Tune trial, through the tracked-run sequence the sweep and prune run.

The same guarantees as the prune stage's fine-tuning, by the same code (``pipeline.sweep.tracked``): the sweep's
trainable started from the converted weights (``init_from``), retries from checkpoints, restore after Ctrl-C, the
MLflow outage buffer, interrupted runs closed; a finished fine-tuning of the same identity (``transform_key``) is
reused. One MLflow child run per network under a ``transform-<hash>`` parent run in the sweep's experiment; step 0 of
its ``test_acc`` is the accuracy before any training (the source's, by Theorem 1), so the UI draws the fine-tuning
from there; the trial records per-epoch locality and head histories as for any Gaussian-attention model. What is this
stage's own: its identity per network, saving the converted weights, and linking each source run to its child.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from pipeline.config import Params, params_hash
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.prune.run import save_start_checkpoint, schedule_params
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
from pipeline.sweep.tracking.store import find_runs, mlflow_client
from pipeline.sweep.tracking.tags import KEY_TAG, NOTE_TAG, flatten, git_commit, parent_run_name
from pipeline.sweep.tuner import trial_config
from pipeline.transform.manifest import STAGE, TransformedModel, TransformManifest
from pipeline.transform.plan import TransformPlan

log = logging.getLogger(__name__)


@dataclass
class TransformOutcome:
    manifest: TransformManifest
    tracked: TrackedOutcome | None = None  # None: nothing to transform, no run

    @property
    def interrupted(self) -> bool:
        return self.tracked is not None and self.tracked.interrupted

    @property
    def failed(self) -> bool:
        return self.tracked is not None and self.tracked.failed


def finetune_params(params: Params) -> Params:
    """The sweep's params as the fine-tuning trials see them: lr x ``transform.lr_factor``, ``transform.epochs``."""
    return schedule_params(params, params.transform.lr_factor, params.transform.epochs)


def transform_key(params: Params, plan: TransformPlan) -> str:
    """Identity of one converted and fine-tuned network: its source trial's identity (which holds the trial code, and
    so the conversion), its name and the transform config (epochs, lr factor)."""
    source = plan.source.trial_key or {"run": plan.source.run_id, "code": code_hash()}
    rule = params.transform.model_dump(mode="json", exclude={"variants"})
    return params_hash({"source": source, "transform": {**rule, "name": plan.name}})


def transform_decisions(
    params: Params, tune_manifest: TuneManifest, plans: list[TransformPlan]
) -> dict[str, TrialDecision]:
    """Per planned network (``TransformPlan.key``): reuse its finished fine-tuning, resume it, or train."""
    keys = {plan.key: transform_key(params, plan) for plan in plans}
    found = find_runs(mlflow_client(tune_manifest.tracking_uri), tune_manifest.experiment_id, keys.values())
    epochs, retrain = params.transform.epochs, params.sweep.retrain
    return {
        plan.key: decide(plan.name, plan.source.seed, keys[plan.key], found[keys[plan.key]], epochs, retrain=retrain)
        for plan in plans
    }


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
            KEY_TAG: plan["transform_key"],
            "source_run_id": plan["source_run_id"],
            "transform.converted_dir": plan["converted_dir"],
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


class Transform(TrackedStage):
    """The transform stage's part of the tracked run: its identity per network, saving the converted weights that
    fine-tune, linking each source run to its child."""

    def __init__(
        self,
        params: Params,
        data: PreparedData,
        tune_manifest: TuneManifest,
        plans: list[TransformPlan],
        project_root: Path,
    ) -> None:
        self.params, self.tune_manifest, self.plans = params, tune_manifest, plans
        self.keys = {plan.key: transform_key(params, plan) for plan in plans}
        self.name = f"{STAGE}-{params_hash({'models': sorted(self.keys.values())})}"
        self.work = "fine-tuning"
        self.run_name = parent_run_name(STAGE, params, project_root, self.name)
        self.tracking_uri = tune_manifest.tracking_uri
        self.experiment = mlflow_client(self.tracking_uri).get_experiment(tune_manifest.experiment_id).name
        commit = git_commit(project_root)
        self.tags = {"dvc_stage": STAGE, "params_hash": self.name.removeprefix(f"{STAGE}-"), "git_commit": commit}
        self.parent_tags = {"transform.source_sweep_run_id": tune_manifest.parent_run_id}
        self.rule = transform_rule(params)
        self.parent_params = flatten({"transform": self.rule, "sources": len(plans)})
        self.tuner_params = finetune_params(params)
        self.data_hash = content_hash(data)
        self.dataset = PreparedDataset.of(params.data, self.data_hash, project_root)
        self.summaries: dict[str, dict] = {}  # per network fine-tuned in this run: what its run describes
        self.reused: dict[str, TransformedModel] = {}

    def decide(self, parent: ParentRun) -> list[TrialDecision]:
        return list(transform_decisions(self.params, self.tune_manifest, self.plans).values())

    def trials(self, decisions: list[TrialDecision], path: StoragePath) -> tuple[list[dict], Callable]:
        """Save every network that fine-tunes where every node reads it; read the reused ones' runs now."""
        by_plan = {f"{d.variant}-seed{d.seed}": d for d in decisions}
        client = mlflow_client(self.tracking_uri)
        self.reused = {
            p.key: _reused_model(p, client, by_plan[p.key]) for p in self.plans if by_plan[p.key].action == REUSE
        }
        trials = []
        for plan in (p for p in self.plans if p.key not in self.reused):
            converted_dir = path / "converted" / plan.key
            model_cfg = self.params.model_for(plan.name)
            save_start_checkpoint(
                converted_dir, plan.model, model_cfg, image_shape=plan.image_shape, num_classes=plan.num_classes
            )
            self.summaries[plan.key] = {
                "source_run_id": str(plan.source.run_id),
                "source_run_name": plan.source.run_name or plan.key,
                "source_experiment_id": self.tune_manifest.experiment_id,
                "exactness": plan.exactness,
                "converted_dir": str(converted_dir),
                "transform_key": self.keys[plan.key],
            }
            trials.append({**trial_config(by_plan[plan.key]), "init_from": str(converted_dir)})
        run_info = functools.partial(
            transform_run_info,
            params_json=self.tuner_params.model_dump(mode="json"),
            data_hash=self.data_hash,
            plans=self.summaries,
        )
        return trials, run_info

    def models(self, records: list[TrialRecord]) -> list[TransformedModel]:
        """Every planned network, fine-tuned in this run (from its record) or reused."""
        by_key = {f"{r.variant}-seed{r.seed}": r for r in records}
        models = [
            self.reused[plan.key]
            if plan.key in self.reused
            else _transformed_model(plan, self.summaries[plan.key], by_key.get(plan.key))
            for plan in self.plans
        ]
        for model, plan in zip(models, self.plans, strict=True):
            model.transform_key = self.keys[plan.key]
        return models

    def wrap_up(
        self, parent: ParentRun, decisions: list[TrialDecision], records: list[TrialRecord], buffer: TrackingBuffer
    ) -> dict[str, str]:
        models = self.models(records)
        for model in models:
            if model.run_id and not model.reused:
                buffer.set_tags(model.source_run_id, {"transform.child_run_id": model.run_id})
        return {"transform.models": str(len(models)), "transform.models_reused": str(sum(m.reused for m in models))}


def transform_rule(params: Params) -> dict[str, Any]:
    """The transform section and the fine-tuning learning rate: the manifest's ``rule`` and the parent's params."""
    return {**params.transform.model_dump(mode="json"), "finetune_lr": params.train.lr * params.transform.lr_factor}


def run_transform(
    params: Params, data: PreparedData, project_root: Path, tune_manifest: TuneManifest, plans: list[TransformPlan]
) -> TransformOutcome:
    """Fine-tune every checked network whose identity has no finished fine-tuning run yet; the manifest names each
    network's fine-tuning run, reused or new."""
    if not plans:
        log.info("nothing to transform (transform.variants is empty)")
        empty = TransformManifest(
            "", "", tune_manifest.experiment_name, tune_manifest.tracking_uri, tune_manifest.experiment_id, "", {}, []
        )
        return TransformOutcome(empty)
    stage = Transform(params, data, tune_manifest, plans, project_root)
    tracked = run_tracked(stage, params, data, project_root)
    manifest = TransformManifest(
        stage.name,
        str(tracked.path),
        tune_manifest.experiment_name,
        tune_manifest.tracking_uri,
        tune_manifest.experiment_id,
        tracked.parent.parent_run_id,
        stage.rule,
        stage.models(tracked.records),
    )
    return TransformOutcome(manifest, tracked)


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


def _reused_model(plan: TransformPlan, client: MlflowClient, decided: TrialDecision) -> TransformedModel:
    """A network whose fine-tuning finished in an earlier run: its accuracy after fine-tuning comes from that run."""
    run = client.get_run(str(decided.run_id))
    return TransformedModel(
        **_from_plan(plan),
        run_id=run.info.run_id,
        run_name=run.info.run_name,
        status=FINISHED,
        epochs_completed=decided.epoch,
        test_acc=run.data.metrics.get("test_acc"),
        converted_checkpoint_dir=run.data.tags.get("transform.converted_dir", ""),
        checkpoint_dir=decided.checkpoint_dir,
        metrics={**run.data.metrics, "epoch": float(decided.epoch)},
        reused=True,
    )


def _transformed_model(plan: TransformPlan, summary: dict, record: TrialRecord | None) -> TransformedModel:
    """A network fine-tuned in this run (``record``: its trial; None when it never started)."""
    metrics = record.metrics if record else {}
    return TransformedModel(
        **_from_plan(plan),
        run_id=record.run_id if record else None,
        run_name=record.run_name if record else None,
        status=record.status if record else INTERRUPTED,
        epochs_completed=record.epochs_completed if record else 0,
        test_acc=metrics.get("test_acc"),
        converted_checkpoint_dir=summary["converted_dir"],
        checkpoint_dir=record.checkpoint_dir if record else None,
        metrics=metrics,
    )
