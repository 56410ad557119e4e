"""Prune (App. A.1): the degenerate attention heads of a trained Gaussian model cut, then fine-tuned.

The rule is ``pipeline.models.pruning``'s (trial code): a head goes when its covariance is degenerate (``threshold``,
the paper's) or is among a layer's most degenerate (``fraction``). Step 0 of a pruned model's run is its accuracy
right after pruning; the run carries each head's decision as ``pruning_decisions.json``; the best pruned model of
each variant is registered as ``<experiment>.<variant>_pruned``.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from pipeline.config import Params
from pipeline.finetune.plan import Plan
from pipeline.finetune.recipe import Recipe
from pipeline.models.pruning import covariance_geometry, head_decisions, prune_model, pruned_per_layer
from pipeline.sweep.manifest import FINISHED, TuneManifest
from pipeline.trial.device_data import DeviceData
from pipeline.trial.loop import evaluate

log = logging.getLogger(__name__)


@dataclass
class PrunedModel:
    """One pruned and fine-tuned model: an entry of ``results/prune/manifest.json``."""

    source_run_id: str
    source_trial_id: str
    variant: str
    seed: int
    run_id: str | None  # the fine-tuning run (None: it never started)
    run_name: str | None
    status: str  # as in the tune manifest: finished | error | interrupted
    epochs_completed: int  # fine-tuning epochs
    pruned_heads: list[int]  # heads cut per layer, e.g. [2, 4, 1, 2, 6, 0]
    heads_per_layer: list[int]  # heads left per layer
    params_before: int
    params_after: int
    flops_before: dict[str, int]  # {"paper": ..., "full": ...} (FLOP_CONVENTIONS)
    flops_after: dict[str, int]
    acc_before_pruning: float  # the source checkpoint, evaluated here
    acc_after_pruning: float  # the pruned model before any fine-tuning (MLflow step 0)
    acc_after_finetune: float | None  # the last fine-tuning epoch
    pruned_checkpoint_dir: str  # the pruned weights fine-tuning started from
    checkpoint_dir: str | None  # the last fine-tuning checkpoint
    decisions: list[list[dict[str, Any]]]  # per layer and head: eigenvalues, criteria, cut or kept and why
    metrics: dict[str, float] = field(default_factory=dict)  # the last fine-tuning epoch's report
    prune_key: str | None = None  # identity: the source trial's key and the prune config
    reused: bool = False  # an earlier prune run's finished fine-tuning run of the same identity, not trained again
    PATHS: ClassVar[tuple[str, ...]] = ("pruned_checkpoint_dir", "checkpoint_dir")  # project-relative in the file

    @property
    def final_acc(self) -> float | None:
        return self.acc_after_finetune

    def summary(self) -> tuple[str, dict[str, float]]:
        """``<variant>_pruned`` in ``metrics.json``: accuracy right after pruning and after fine-tuning."""
        return f"{self.variant}_pruned", {"acc_after_pruning": self.acc_after_pruning, "test_acc": self.final_acc}


class Prune(Recipe):
    stage, start_folder, entry, rule_module = "prune", "pruned", PrunedModel, "pipeline.models.pruning"
    run_suffix, step0_metric, register_suffix = " pruned", "test_acc", "_pruned"

    def sources(self, params: Params, manifest: TuneManifest, manifest_path: Path) -> tuple[list, list[dict]]:
        """The finished trials of ``prune.variants``; the other trials of those variants are skipped, with why."""
        chosen, skipped = [], []
        for trial in (t for t in manifest.trials if t.variant in params.prune_variants()):
            if trial.status == FINISHED and (trial.checkpoint_dir or trial.artifacts.get("checkpoint")):
                chosen.append((trial.variant, trial))
            else:
                reason = f"trial status {trial.status!r} (only finished trials are pruned)"
                about = {"variant": trial.variant, "seed": str(trial.seed), "run_id": str(trial.run_id)}
                skipped.append({**about, "reason": reason})
        return chosen, skipped

    def build(self, params: Params, name: str, source: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
        cfg, model = params.prune, copy.deepcopy(source)
        try:
            geometry = covariance_geometry(model)
        except ValueError as err:
            raise ValueError(f"prune.variants: {name}: {err}") from None
        rule = {"min_eigenvalue": cfg.min_eigenvalue, "max_condition": cfg.max_condition, "fraction": cfg.fraction}
        decided = head_decisions(geometry, mode=cfg.mode, **rule)
        prune_model(model, decided)
        facts = {"pruned_heads": pruned_per_layer(decided), "heads_per_layer": list(model.heads_per_layer)}
        return model, {**facts, "decisions": [[d.to_dict() for d in layer] for layer in decided]}

    def identity(self, params: Params, plan: Plan) -> Any:
        return params.prune.model_dump(mode="json")

    def header(self, params: Params) -> list[str]:
        cfg = params.prune
        rule = (
            f"threshold (the paper's): largest eigenvalue < {cfg.min_eigenvalue:g} or condition number > "
            f"{cfg.max_condition:g}"
            if cfg.mode == "threshold"
            else f"fraction (ours): per layer the {cfg.fraction:g} most degenerate heads, at least one"
        )
        return [f"rule: {rule}", f"fine-tuning: {cfg.epochs} epochs at {cfg.lr_factor:g} x the trial's lr"]

    def dry_run(self, plan: Plan) -> tuple[str, list[str]]:
        cut, left = plan.facts["pruned_heads"], plan.facts["heads_per_layer"]
        head = f"{plan.key} (run {plan.source.run_id}): heads cut per layer {cut}, left {left}"
        layers = plan.facts["decisions"]
        return head, [
            f"    layer {d['layer'] + 1} head {d['head']}: {d['reason']}" for ds in layers for d in ds if d["pruned"]
        ]

    def nothing(self, params: Params) -> str:
        return f"nothing to prune: no finished trial of {params.prune_variants() or 'any Gaussian variant'}"

    def start(self, params: Params, plan: Plan, device_data: Callable[[], DeviceData]) -> dict[str, Any]:
        """Test loss and accuracy of the pruned model before any fine-tuning (the dip of Fig. 8)."""
        data, batch = device_data(), params.train.eval_batch_size
        model = plan.model.to(data.test_labels.device)
        loss, accuracy = evaluate(model, data.test_images, data.test_labels, data, batch, None)
        plan.model = model.cpu()
        before = plan.source.metrics.get("test_acc", math.nan)
        log.info(
            "%s: heads cut per layer %s; test acc %.4f -> %.4f", plan.key, plan.facts["pruned_heads"], before, accuracy
        )
        cut, left = plan.facts["pruned_heads"], plan.facts["heads_per_layer"]
        return {
            "params": {
                **{f"prune.pruned_heads.layer{i + 1}": str(n) for i, n in enumerate(cut)},
                "prune.heads_per_layer": str(left),
            },
            "tags": {"prune.pruned_heads": str(cut)},
            "metrics": {"test_acc": accuracy, "test_loss": loss},
            "artifacts": {"pruning_decisions.json": plan.facts["decisions"]},
            **{"pruned_heads": cut, "heads_per_layer": left, "acc_after_pruning": accuracy},
        }

    def note(self, summary: dict[str, Any]) -> str:
        source = f"#/experiments/{summary['source_experiment_id']}/runs/{summary['source_run_id']}"
        cut = sum(summary["pruned_heads"])
        return (
            f"Pruned from [{summary['source_run_name']}]({source}) (run `{summary['source_run_id']}`): {cut} of "
            f"{cut + sum(summary['heads_per_layer'])} heads cut (per layer {summary['pruned_heads']}), then "
            f"fine-tuned. Step 0 is the test accuracy right after pruning ({summary['acc_after_pruning']:.4f}); "
            "`pruning_decisions.json` holds each head's decision."
        )

    def entry_of(self, plan: Plan, run: dict[str, Any]) -> PrunedModel:
        step0, facts = run.pop("step0"), plan.facts
        return PrunedModel(
            **{k: run[k] for k in ("run_id", "run_name", "status", "epochs_completed", "checkpoint_dir", "metrics")},
            source_run_id=str(plan.source.run_id),
            source_trial_id=plan.source.trial_id,
            variant=plan.source.variant,
            seed=plan.source.seed,
            **{k: facts[k] for k in ("pruned_heads", "heads_per_layer", "decisions")},
            params_before=plan.params_before,
            params_after=plan.params_after,
            flops_before=plan.flops_before,
            flops_after=plan.flops_after,
            acc_before_pruning=float(plan.source.metrics.get("test_acc", math.nan)),
            acc_after_pruning=math.nan if step0 is None else step0,
            acc_after_finetune=run["metrics"].get("test_acc"),
            pruned_checkpoint_dir=run["start_dir"],
            prune_key=run["key"],
            reused=run["reused"],
        )

    def log_line(self, model: PrunedModel) -> str:
        after = f"{model.acc_after_finetune:.4f}" if model.acc_after_finetune is not None else "-"
        return (
            f"{model.variant} seed {model.seed}: heads cut {model.pruned_heads}, params {model.params_before:,} -> "
            f"{model.params_after:,}, test acc {model.acc_before_pruning:.4f} before, {model.acc_after_pruning:.4f} "
            f"right after pruning, {after} after {model.epochs_completed} fine-tuning epochs"
        )


RECIPE = Prune()
