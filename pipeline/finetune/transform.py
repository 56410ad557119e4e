"""Transform (Theorem 1): a trained ResNet18 rebuilt as an exactly equal attention network, checked, then fine-tuned.

Each ``transform.variants`` entry names the sweep's ResNet18 variant it is built from; a sweep without a finished
trial of it for every seed is refused naming the variant (a network built from a half-trained ResNet would prove
nothing). Every 3x3 convolution becomes a 9-head quadratic attention layer (``pipeline.models.transformed_resnet``).
``check`` evaluates both networks on the test set before any training, on every run: the rebuild must give the
source's test accuracy (float32) and its logits to ``FLOAT64_BOUND`` in float64, or nothing is fine-tuned. Step 0 of
a network's run is its accuracy before any training (the source's, by Theorem 1).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from pipeline.config import Params
from pipeline.finetune.plan import Plan
from pipeline.finetune.recipe import Recipe
from pipeline.models.conv_to_attention import DEFAULT_ALPHA
from pipeline.models.transformed_resnet import transform_resnet
from pipeline.sweep.manifest import FINISHED, TuneManifest
from pipeline.trial.device_data import DeviceData

log = logging.getLogger(__name__)
FLOAT64_BOUND = 1e-9  # largest |logit difference| accepted in float64 (Theorem 1 at alpha 50: ~1e-15)


@dataclass
class TransformedModel:
    """One trained ResNet18 rebuilt as attention, then fine-tuned: an entry of ``results/transform/manifest.json``."""

    name: str  # the transform variant, e.g. t_resnet18
    source_variant: str  # the sweep's variant it was built from, e.g. resnet18
    source_run_id: str
    source_trial_id: str
    seed: int
    run_id: str | None  # the fine-tuning run (None: it never started)
    run_name: str | None
    status: str  # as in the tune manifest: finished | error | interrupted
    epochs_completed: int  # fine-tuning epochs
    converted_layers: list[str]  # module names of the convolutions now attention (stem.0, stages.0.0.conv1, ...)
    source_test_acc: float  # the source ResNet18 evaluated here, float32
    test_acc_step0: float  # the converted network before any training, float32: equal to source_test_acc
    max_logit_diff_float32: float  # largest |logit difference| to the source over the test set
    max_logit_diff_float64: float  # the same, both networks in float64
    test_acc: float | None  # after the last fine-tuning epoch
    params_source: int
    params: int
    flops_source: dict[str, int]  # {"paper": ..., "full": ...} per image (FLOP_CONVENTIONS)
    flops: dict[str, int]
    converted_checkpoint_dir: str  # the converted weights fine-tuning started from
    checkpoint_dir: str | None  # the last fine-tuning checkpoint
    metrics: dict[str, float] = field(default_factory=dict)  # the last fine-tuning epoch's report
    transform_key: str | None = None  # identity: the source trial's key and the transform config
    reused: bool = False  # an earlier run's finished fine-tuning of the same identity, not trained again
    PATHS: ClassVar[tuple[str, ...]] = ("converted_checkpoint_dir", "checkpoint_dir")

    @property
    def final_acc(self) -> float | None:
        return self.test_acc

    def summary(self) -> tuple[str, dict[str, float]]:
        """Its name in ``metrics.json``: accuracy before any training (the source's) and after fine-tuning."""
        return self.name, {"test_acc_step0": self.test_acc_step0, "test_acc": self.final_acc}


@torch.no_grad()
def logits_on_test_set(model: nn.Module, data: DeviceData, batch_size: int, dtype: torch.dtype) -> Tensor:
    """``model``'s logits (M, classes) on the whole test set, its inputs normalised as in training, in ``dtype``."""
    model.eval()
    batches = [
        model(data.normalise(data.test_images[start : start + batch_size].float().div(255)).to(dtype))
        for start in range(0, data.test_labels.numel(), batch_size)
    ]
    return torch.cat(batches)


def check_exact(plan: Plan, data: DeviceData, batch_size: int) -> dict[str, float]:
    """Theorem 1 on the trained network, before any training: both networks' test accuracy and test loss (float32)
    and the largest logit difference in float32 and float64, kept in ``plan.facts["exactness"]``. Raises
    ``ValueError`` naming the variant when the accuracies differ or the float64 logits differ by more than
    ``FLOAT64_BOUND``."""
    labels, pair = data.test_labels.cpu(), (plan.source_model, plan.model)
    source32, rebuilt32 = (logits_on_test_set(m, data, batch_size, torch.float32).cpu() for m in pair)
    source64, rebuilt64 = (logits_on_test_set(copy.deepcopy(m).double(), data, batch_size, torch.float64) for m in pair)
    figures = {
        "source_test_acc": (source32.argmax(1) == labels).double().mean().item(),
        "test_acc_step0": (rebuilt32.argmax(1) == labels).double().mean().item(),
        "test_loss_step0": torch.nn.functional.cross_entropy(rebuilt32, labels).item(),
        "max_logit_diff_float32": (rebuilt32 - source32).abs().max().item(),
        "max_logit_diff_float64": (rebuilt64 - source64).abs().max().item(),
        "alpha": DEFAULT_ALPHA,
    }
    plan.facts["exactness"] = figures
    where = f"{plan.key}: the rebuild of {plan.source.variant} run {plan.source.run_id}"
    if figures["test_acc_step0"] != figures["source_test_acc"]:
        raise ValueError(
            f"{where} has test accuracy {figures['test_acc_step0']:.6f} before any training, its source "
            f"{figures['source_test_acc']:.6f} (largest logit difference {figures['max_logit_diff_float32']:.3g}): "
            "Theorem 1 does not hold here; not fine-tuning it"
        )
    if figures["max_logit_diff_float64"] > FLOAT64_BOUND:
        raise ValueError(
            f"{where} differs from its source by {figures['max_logit_diff_float64']:.3g} in float64 logits (bound "
            f"{FLOAT64_BOUND:g}): Theorem 1 does not hold here; not fine-tuning it"
        )
    return figures


class Transform(Recipe):
    stage, start_folder, entry = "transform", "converted", TransformedModel
    rule_module = "pipeline.models.transformed_resnet"

    def sources(self, params: Params, manifest: TuneManifest, manifest_path: Path) -> tuple[list, None]:
        """(transform variant, its source trial) per variant and seed of the sweep; a missing or unfinished source
        is refused naming the variant, before any work."""
        chosen = []
        for name, source in params.transform.variants.items():
            for seed in params.sweep.seeds:
                trial = next((t for t in manifest.trials if (t.variant, t.seed) == (source, seed)), None)
                where = f"transform.variants.{name}: {name} seed {seed} is built from"
                if trial is None:
                    raise ValueError(
                        f"{where} the sweep's {source} of the same seed, and {manifest_path} has none (add {source} "
                        f"to sweep.variants, or remove {name} from transform.variants)"
                    )
                if trial.status != FINISHED or not (trial.checkpoint_dir or trial.artifacts.get("checkpoint")):
                    raise ValueError(
                        f"{where} a trained {source}, and run {trial.run_id} of {source} seed {seed} did not finish "
                        f"(status {trial.status!r}); re-run the tune stage"
                    )
                chosen.append((name, trial))
        return chosen, None

    def build(self, params: Params, name: str, source: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
        model = transform_resnet(source)
        return model, {"converted": list(model.converted)}

    def identity(self, params: Params, plan: Plan) -> Any:
        return {**params.transform.model_dump(mode="json", exclude={"variants"}), "name": plan.name}

    def header(self, params: Params) -> list[str]:
        cfg = params.transform
        return [f"fine-tuning: {cfg.epochs} epochs at {cfg.lr_factor:g} x the source trial's lr"]

    def dry_run(self, plan: Plan) -> tuple[str, list[str]]:
        converted, source = len(plan.facts["converted"]), plan.source
        return (
            f"{plan.key} (from {source.variant} run {source.run_id}): {converted} 3x3 convolutions as 9-head attention",
            [],
        )

    def nothing(self, params: Params) -> str:
        return "nothing to transform (transform.variants is empty)"

    def check(self, params: Params, plans: list[Plan], data: Any) -> None:
        on_cpu = DeviceData.from_prepared(data, "cpu") if plans else None
        for plan in plans:  # Theorem 1 before any training, on every run: a rebuild that is not exact never trains
            exact = check_exact(plan, on_cpu, params.train.eval_batch_size)
            log.info(
                "%s: %d convolutions as attention; test acc %.4f = its source's %.4f before training; largest logit "
                "difference %.2g (float32), %.2g (float64)",
                plan.key,
                len(plan.facts["converted"]),
                exact["test_acc_step0"],
                exact["source_test_acc"],
                exact["max_logit_diff_float32"],
                exact["max_logit_diff_float64"],
            )

    def start(self, params: Params, plan: Plan, device_data: Callable[[], DeviceData]) -> dict[str, Any]:
        exact = plan.facts["exactness"]  # checked before any run (``check``)
        figures = ("source_test_acc", "max_logit_diff_float32", "max_logit_diff_float64")
        step0 = {"test_acc": exact["test_acc_step0"], "test_loss": exact["test_loss_step0"]}
        metrics = {**step0, "test_acc_step0": exact["test_acc_step0"], **{k: exact[k] for k in figures}}
        return {"params": {"transform.alpha": exact["alpha"]}, "metrics": metrics, "exactness": exact}

    def note(self, summary: dict[str, Any]) -> str:
        source = f"#/experiments/{summary['source_experiment_id']}/runs/{summary['source_run_id']}"
        exact = summary["exactness"]
        return (
            f"[{summary['source_run_name']}]({source}) rebuilt as attention (Theorem 1: each 3x3 convolution a 9-head "
            f"quadratic attention layer), then fine-tuned. Step 0 is its test accuracy before any training "
            f"({exact['test_acc_step0']:.4f}, the source's {exact['source_test_acc']:.4f}); largest logit difference "
            f"{exact['max_logit_diff_float32']:.2g} in float32, {exact['max_logit_diff_float64']:.2g} in float64."
        )

    def entry_of(self, plan: Plan, run: dict[str, Any]) -> TransformedModel:
        exact = plan.facts["exactness"]
        figures = ("source_test_acc", "test_acc_step0", "max_logit_diff_float32", "max_logit_diff_float64")
        return TransformedModel(
            name=plan.name,
            source_variant=plan.source.variant,
            source_run_id=str(plan.source.run_id),
            source_trial_id=plan.source.trial_id,
            seed=plan.source.seed,
            **{k: run[k] for k in ("run_id", "run_name", "status", "epochs_completed", "checkpoint_dir", "metrics")},
            converted_layers=plan.facts["converted"],
            **{k: exact[k] for k in figures},
            test_acc=run["metrics"].get("test_acc"),
            params_source=plan.params_before,
            params=plan.params_after,
            flops_source=plan.flops_before,
            flops=plan.flops_after,
            converted_checkpoint_dir=run["start_dir"],
            transform_key=run["key"],
            reused=run["reused"],
        )

    def log_line(self, model: TransformedModel) -> str:
        after = f"{model.test_acc:.4f}" if model.test_acc is not None else "-"
        return (
            f"{model.name} seed {model.seed}: test acc {model.test_acc_step0:.4f} before training (source "
            f"{model.source_test_acc:.4f}), {after} after {model.epochs_completed} fine-tuning epochs"
        )


RECIPE = Transform()
