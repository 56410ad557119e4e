"""Which trained ResNet18 each transform variant is built from, the conversion, and its check: before Ray starts.

Reads the tune manifest (refused when stale, as the prune stage does), finds for each ``transform.variants`` entry
and each seed of the sweep the finished trial of its source variant, and refuses, naming the variant, a sweep without
one or with one that did not finish: a network built from a half-trained ResNet would prove nothing. Each source's
last checkpoint is converted (``pipeline.models.transformed_resnet``) and counted. ``check_exact`` then evaluates both
networks on the test set: the converted one must give the source's test accuracy (float32) and its logits to
``FLOAT64_BOUND`` in float64, or nothing is fine-tuned (the stage fails with both numbers).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from pipeline.config import Params
from pipeline.measure.counting import count_flops, count_parameters
from pipeline.models.conv_to_attention import DEFAULT_ALPHA
from pipeline.models.transformed_resnet import TransformedResNet18, transform_resnet
from pipeline.sweep.finetune import schedule_params
from pipeline.sweep.manifest import FINISHED, TrialRecord, TuneManifest
from pipeline.trial.checkpoint import load_checkpoint, model_from_payload
from pipeline.trial.loop import DeviceData

FLOAT64_BOUND = 1e-9  # largest |logit difference| accepted in float64 (Theorem 1 at alpha 50: ~1e-15)


@dataclass
class TransformPlan:
    """One trained ResNet18 and its attention rebuild (not yet checked, saved or fine-tuned)."""

    name: str  # the transform variant, e.g. t_resnet18
    source: TrialRecord
    resnet: nn.Module  # the source, on the CPU, eval mode
    model: TransformedResNet18  # the rebuild, on the CPU, eval mode
    image_shape: tuple[int, int, int]
    num_classes: int
    params_source: int
    params: int
    flops_source: dict[str, int]
    flops: dict[str, int]
    exactness: dict[str, float] = field(default_factory=dict)  # check_exact's figures

    @property
    def key(self) -> str:
        return f"{self.name}-seed{self.source.seed}"


def select_sources(params: Params, manifest: TuneManifest, manifest_path: Path) -> list[tuple[str, TrialRecord]]:
    """(transform variant, its source trial) per variant and seed of the sweep; a missing or unfinished source is
    refused naming the variant, before any work."""
    chosen = []
    for name, source in params.transform.variants.items():
        for seed in params.sweep.seeds:
            trial = next((t for t in manifest.trials if (t.variant, t.seed) == (source, seed)), None)
            where = f"transform.variants.{name}"
            if trial is None:
                raise ValueError(
                    f"{where}: {name} seed {seed} is built from the sweep's {source} of the same seed, and "
                    f"{manifest_path} has none (add {source} to sweep.variants, or remove {name} from "
                    "transform.variants)"
                )
            if trial.status != FINISHED or not (trial.checkpoint_dir or trial.artifacts.get("checkpoint")):
                raise ValueError(
                    f"{where}: {name} seed {seed} is built from a trained {source}, and run {trial.run_id} of "
                    f"{source} seed {seed} did not finish (status {trial.status!r}); re-run the tune stage"
                )
            chosen.append((name, trial))
    return chosen


def plan_transform(name: str, source: TrialRecord) -> TransformPlan:
    """Load the source's last checkpoint, rebuild it as attention, count both."""
    saved = load_checkpoint(Path(str(source.checkpoint_dir)))
    image_shape = tuple(int(v) for v in saved["image_shape"])
    resnet = model_from_payload(saved)
    model = transform_resnet(resnet)
    before, after = count_flops(resnet, image_shape), count_flops(model, image_shape)
    return TransformPlan(
        name=name,
        source=source,
        resnet=resnet,
        model=model,
        image_shape=image_shape,
        num_classes=int(saved["num_classes"]),
        params_source=count_parameters(resnet),
        params=count_parameters(model),
        flops_source={"paper": before.paper, "full": before.full},
        flops={"paper": after.paper, "full": after.full},
    )


@torch.no_grad()
def logits_on_test_set(model: nn.Module, data: DeviceData, batch_size: int, dtype: torch.dtype) -> Tensor:
    """``model``'s logits (M, classes) on the whole test set, its inputs normalised as in training, in ``dtype``."""
    model.eval()
    batches = [
        model(data.normalise(data.test_images[start : start + batch_size].float().div(255)).to(dtype))
        for start in range(0, data.test_labels.numel(), batch_size)
    ]
    return torch.cat(batches)


def check_exact(plan: TransformPlan, data: DeviceData, batch_size: int) -> dict[str, float]:
    """Theorem 1 on the trained network, before any training: both networks' test accuracy and test loss (float32)
    and the largest logit difference in float32 and float64, recorded in ``plan.exactness``. Raises ``ValueError``
    naming the variant when the accuracies differ or the float64 logits differ by more than ``FLOAT64_BOUND``."""
    labels = data.test_labels.cpu()
    pair = (plan.resnet, plan.model)
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
    plan.exactness = figures
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


def format_plans(plans: list[TransformPlan], params: Params, actions: dict[str, str] | None = None) -> str:
    """The dry run: per network, its source run, the layers converted, params and FLOPs before and after, and
    (``actions``) whether its fine-tuning would reuse a finished run, resume one or train."""
    cfg = params.transform
    lines = [f"fine-tuning: {cfg.epochs} epochs at {cfg.lr_factor:g} x the source trial's lr", ""]
    tuned = schedule_params(params, cfg.lr_factor, cfg.epochs)  # what the fine-tuning trials train with
    for plan in plans:
        action = f"; fine-tuning: {actions[plan.key]}" if actions and plan.key in actions else ""
        lr = tuned.train_for(plan.source.variant).lr  # a variant may set its own train.lr
        lines.append(
            f"{plan.key} (from {plan.source.variant} run {plan.source.run_id}): {len(plan.model.converted)} "
            f"3x3 convolutions as 9-head attention; fine-tuning lr {lr:g}{action}"
        )
        lines.append(
            f"    params {plan.params_source:,} -> {plan.params:,}; FLOPs/image (paper convention) "
            f"{plan.flops_source['paper']:,} -> {plan.flops['paper']:,}; full count {plan.flops_source['full']:,} "
            f"-> {plan.flops['full']:,}"
        )
    if not plans:
        lines.append("nothing to transform (transform.variants is empty)")
    return "\n".join(lines)
