"""Which trained models the prune stage prunes, which of their heads go, and what that saves: decided before Ray starts.

Refuses a stale tune manifest (another sweep than the current params, code and data give) and one whose checkpoints
are gone; for each finished trial of ``prune.variants`` loads its last checkpoint, applies the pruning rule
(``pipeline.models.pruning``) and counts parameters and FLOPs before and after. ``--dry-run`` prints this plan.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from pipeline.config import Params
from pipeline.measure.counting import count_flops, count_parameters
from pipeline.models.pruning import covariance_geometry, head_decisions, prune_model, pruned_per_layer
from pipeline.sweep.finetune import schedule_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.manifest import FINISHED, TrialRecord, TuneManifest
from pipeline.sweep.storage import StoragePath, found_file
from pipeline.sweep.tracking.logged_model import download_checkpoint
from pipeline.trial.checkpoint import load_checkpoint, model_from_payload
from pipeline.trial.report import CHECKPOINT_FILE

log = logging.getLogger(__name__)


@dataclass
class PrunePlan:
    """One source trial, pruned in memory (not yet evaluated, saved or fine-tuned)."""

    source: TrialRecord
    model: nn.Module  # the pruned model, on the CPU, eval mode
    image_shape: tuple[int, int, int]
    num_classes: int
    decisions: list[list[dict[str, Any]]]
    pruned_heads: list[int]
    heads_per_layer: list[int]
    params_before: int
    params_after: int
    flops_before: dict[str, int]
    flops_after: dict[str, int]

    @property
    def key(self) -> str:
        return f"{self.source.variant}-seed{self.source.seed}"


def check_fresh(params: Params, manifest: TuneManifest, manifest_path: Path, project_root: Path) -> None:
    """The tune manifest must describe the sweep that the current params, trial code and prepared data define."""
    data_hash = prepared_data_hash(params, project_root)
    expected = experiment_name(params, data_hash or "missing")
    if manifest.experiment_name != expected:
        raise ValueError(
            f"{manifest_path}: stale tune manifest: it names sweep {manifest.experiment_name}, but the current params, "
            f"trial code and prepared data define {expected}; run `dvc repro` (it re-runs the tune stage first)"
        )


def select_sources(params: Params, manifest: TuneManifest) -> tuple[list[TrialRecord], list[dict[str, str]]]:
    """The finished trials of the variants to prune, and every other trial of those variants with the reason."""
    wanted = params.prune_variants()
    sources, skipped = [], []
    for trial in manifest.trials:
        if trial.variant not in wanted:
            continue
        if trial.status == FINISHED and (trial.checkpoint_dir or trial.artifacts.get("checkpoint")):
            sources.append(trial)
        else:
            reason = f"trial status {trial.status!r} (only finished trials are pruned)"
            skipped.append(
                {"variant": trial.variant, "seed": str(trial.seed), "run_id": str(trial.run_id), "reason": reason}
            )
    return sources, skipped


def local_sources(
    sources: list[TrialRecord], tracking_uri: str, cache_dir: Path, manifest_path: Path
) -> list[TrialRecord]:
    """The sources with a checkpoint on this disk: the Ray copy where it still exists (from a bucket, downloaded into
    ``cache_dir/<run id>``), else the run's ``checkpoint`` artifact downloaded through MLflow into the same folder;
    refused before any expensive work when neither exists."""
    local = []
    for trial in sources:
        stored = StoragePath(trial.checkpoint_dir) if trial.checkpoint_dir else None
        if stored is not None and found_file(stored / CHECKPOINT_FILE):
            if stored.remote:  # in the bucket (sweep.storage_path): a copy on this disk to load and prune
                log.info("%s seed %d: downloading its checkpoint from %s", trial.variant, trial.seed, stored)
                stored = StoragePath(stored.download(cache_dir / str(trial.run_id)))
            local.append(dataclasses.replace(trial, checkpoint_dir=str(stored)))
            continue
        if not trial.artifacts.get("checkpoint"):
            raise FileNotFoundError(
                f"{manifest_path}: trial {trial.variant} seed {trial.seed} names checkpoint {trial.checkpoint_dir}, "
                "which no longer exists (were the Ray results under sweep.storage_path deleted?) and none in MLflow; "
                "re-run the tune stage"
            )
        destination = cache_dir / str(trial.run_id)
        destination.mkdir(parents=True, exist_ok=True)
        log.info(
            "%s seed %d: downloading its checkpoint from MLflow (%s)",
            trial.variant,
            trial.seed,
            trial.artifacts["checkpoint"],
        )
        downloaded = download_checkpoint(tracking_uri, trial.artifacts["checkpoint"], destination)
        local.append(dataclasses.replace(trial, checkpoint_dir=downloaded))
    return local


def plan_pruning(params: Params, source: TrialRecord) -> PrunePlan:
    """Load the source's last checkpoint, decide which heads go, prune them, count before and after."""
    cfg = params.prune
    checkpoint_dir = Path(str(source.checkpoint_dir))
    saved = load_checkpoint(checkpoint_dir)
    image_shape = tuple(int(v) for v in saved["image_shape"])
    model = model_from_payload(saved)
    try:
        geometry = covariance_geometry(model)
    except ValueError as err:
        raise ValueError(f"prune.variants: {source.variant}: {err}") from None
    decisions = head_decisions(
        geometry,
        mode=cfg.mode,
        min_eigenvalue=cfg.min_eigenvalue,
        max_condition=cfg.max_condition,
        fraction=cfg.fraction,
    )
    params_before, flops_before = count_parameters(model), count_flops(model, image_shape)
    prune_model(model, decisions)
    flops_after = count_flops(model, image_shape)
    return PrunePlan(
        source=source,
        model=model.eval(),
        image_shape=image_shape,
        num_classes=int(saved["num_classes"]),
        decisions=[[d.to_dict() for d in layer] for layer in decisions],
        pruned_heads=pruned_per_layer(decisions),
        heads_per_layer=list(model.heads_per_layer),
        params_before=params_before,
        params_after=count_parameters(model),
        flops_before={"paper": flops_before.paper, "full": flops_before.full},
        flops_after={"paper": flops_after.paper, "full": flops_after.full},
    )


def format_plans(
    plans: list[PrunePlan], skipped: list[dict[str, str]], params: Params, actions: dict[str, str] | None = None
) -> str:
    """The dry run: per model, the heads cut per layer and why, the parameters and FLOPs it saves, and (``actions``)
    whether its fine-tuning would reuse a finished run, resume one or train."""
    cfg = params.prune
    rule = (
        f"threshold (the paper's): largest eigenvalue < {cfg.min_eigenvalue:g} or condition number > "
        f"{cfg.max_condition:g}"
        if cfg.mode == "threshold"
        else f"fraction (ours): per layer the {cfg.fraction:g} most degenerate heads, at least one"
    )
    lines = [f"rule: {rule}", f"fine-tuning: {cfg.epochs} epochs at {cfg.lr_factor:g} x the trial's lr", ""]
    tuned = schedule_params(params, cfg.lr_factor, cfg.epochs)  # what the fine-tuning trials train with
    for plan in plans:
        action = f"; fine-tuning: {actions[plan.key]}" if actions and plan.key in actions else ""
        lr = tuned.train_for(plan.source.variant).lr  # a variant may set its own train.lr
        lines.append(
            f"{plan.key} (run {plan.source.run_id}): heads cut per layer {plan.pruned_heads}, "
            f"left {plan.heads_per_layer}; fine-tuning lr {lr:g}{action}"
        )
        for layer in plan.decisions:
            lines += [f"    layer {d['layer'] + 1} head {d['head']}: {d['reason']}" for d in layer if d["pruned"]]
        lines.append(
            f"    params {plan.params_before:,} -> {plan.params_after:,}; FLOPs/image (paper convention) "
            f"{plan.flops_before['paper']:,} -> {plan.flops_after['paper']:,}; full count "
            f"{plan.flops_before['full']:,} -> {plan.flops_after['full']:,}"
        )
    lines += [f"skipped {s['variant']} seed {s['seed']}: {s['reason']}" for s in skipped]
    if not plans:
        lines.append(f"nothing to prune: no finished trial of {params.prune_variants() or 'any Gaussian variant'}")
    return "\n".join(lines)
