"""What a fine-tune stage builds, decided before Ray starts, and the dry run that prints it.

Refuses a stale tune manifest (another sweep than the current params, code and data give) and one whose checkpoints
are gone; for each source the recipe takes, loads its last checkpoint, has the recipe build a model from it, and
counts parameters and FLOPs before and after. ``--dry-run`` prints this plan.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from pipeline.config import AshaConfig, Params, parse_params
from pipeline.finetune.recipe import Recipe
from pipeline.io import check_store
from pipeline.measure.counting import count_flops, count_parameters
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.location import adopt_default_store
from pipeline.sweep.manifest import TrialRecord, TuneManifest
from pipeline.sweep.storage import StoragePath, driver_dir, found_file, storage_dir
from pipeline.sweep.tracking import Store
from pipeline.trial.checkpoint import load_checkpoint, model_from_payload
from pipeline.trial.report import CHECKPOINT_FILE

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """One source trial and the model built from it, on the CPU in eval mode (not yet saved or fine-tuned)."""

    name: str  # the variant the built model trains as (prune: its source's; transform: t_resnet18)
    source: TrialRecord
    source_model: nn.Module  # the source's last checkpoint, as trained
    model: nn.Module
    image_shape: tuple[int, int, int]
    num_classes: int
    params_before: int
    params_after: int
    flops_before: dict[str, int]  # {"paper": ..., "full": ...} per image
    flops_after: dict[str, int]
    facts: dict[str, Any]  # the recipe's: the heads it cut and why, the layers it converted, ...

    @property
    def key(self) -> str:
        return f"{self.name}-seed{self.source.seed}"


def check_fresh(params: Params, manifest: TuneManifest, manifest_path: Path, project_root: Path) -> None:
    """The tune manifest must describe the sweep that the current params, trial code and prepared data define."""
    data_hash = prepared_data_hash(params, project_root)
    expected = experiment_name(params, data_hash or "missing")
    if manifest.experiment_name != expected:
        raise ValueError(
            f"{manifest_path}: stale tune manifest: it names sweep {manifest.experiment_name}, but the current params, "
            f"trial code and prepared data define {expected}; run `dvc repro` (it re-runs the tune stage first)"
        )


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
            if stored.remote:  # in the bucket (sweep.storage_path): a copy on this disk to load
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
        where = trial.artifacts["checkpoint"]
        log.info("%s seed %d: downloading its checkpoint from MLflow (%s)", trial.variant, trial.seed, where)
        local.append(
            dataclasses.replace(trial, checkpoint_dir=Store(tracking_uri).download_checkpoint(where, destination))
        )
    return local


def checkpoints_here(
    params: Params, root: Path, manifest: TuneManifest, sources: list[TrialRecord], manifest_path: Path
) -> list[TrialRecord]:
    """The sources with their checkpoints on this disk (``local_sources``), once the tracking store they name
    answers, is the sweep's, and still holds their runs: refused naming the manifest before any expensive work."""
    if not sources:
        return []
    store = Store(manifest.tracking_uri)
    store.check_answers(f"{manifest_path} (tracking_uri)")
    check_store(manifest.tracking_uri, manifest_path)  # missing or corrupt: never a new empty store
    adopt_default_store(manifest.tracking_uri, params.tracking.uri, root)  # a copied or moved project's own
    store.check_runs_exist([s.run_id for s in sources], manifest_path)
    cache = driver_dir(storage_dir(params, root), root) / "downloaded-checkpoints"
    return local_sources(sources, manifest.tracking_uri, cache, manifest_path)


def plan_model(recipe: Recipe, params: Params, name: str, source: TrialRecord) -> Plan:
    """Load the source's last checkpoint, have ``recipe`` build a model from it, count both."""
    saved = load_checkpoint(Path(str(source.checkpoint_dir)))
    image_shape = tuple(int(v) for v in saved["image_shape"])
    trained = model_from_payload(saved)
    model, facts = recipe.build(params, name, trained)
    before, after = count_flops(trained, image_shape), count_flops(model, image_shape)
    return Plan(
        name=name,
        source=source,
        source_model=trained.eval(),
        model=model.eval(),
        image_shape=image_shape,
        num_classes=int(saved["num_classes"]),
        params_before=count_parameters(trained),
        params_after=count_parameters(model),
        flops_before={"paper": before.paper, "full": before.full},
        flops_after={"paper": after.paper, "full": after.full},
        facts=facts,
    )


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


def finetune_params(recipe: Recipe, params: Params) -> Params:
    """The params the recipe's fine-tuning trials run with: its section's ``lr_factor`` and ``epochs``."""
    section = getattr(params, recipe.stage)
    return schedule_params(params, section.lr_factor, section.epochs)


def format_plans(
    recipe: Recipe,
    plans: list[Plan],
    skipped: list[dict[str, str]] | None,
    params: Params,
    actions: dict[str, str] | None = None,
) -> str:
    """The dry run: per model, what the recipe did, the parameters and FLOPs before and after, the fine-tuning lr and
    (``actions``) whether its fine-tuning would reuse a finished run, resume one or train."""
    lines = [*recipe.header(params), ""]
    tuned = finetune_params(recipe, params)  # what the fine-tuning trials train with
    for plan in plans:
        action = f"; fine-tuning: {actions[plan.key]}" if actions and plan.key in actions else ""
        lr = tuned.train_for(plan.source.variant).lr  # a variant may set its own train.lr
        head, details = recipe.dry_run(plan)
        lines += [f"{head}; fine-tuning lr {lr:g}{action}", *details]
        lines.append(
            f"    params {plan.params_before:,} -> {plan.params_after:,}; FLOPs/image (paper convention) "
            f"{plan.flops_before['paper']:,} -> {plan.flops_after['paper']:,}; full count "
            f"{plan.flops_before['full']:,} -> {plan.flops_after['full']:,}"
        )
    lines += [f"skipped {s['variant']} seed {s['seed']}: {s['reason']}" for s in skipped or []]
    if not plans:
        lines.append(recipe.nothing(params))
    return "\n".join(lines)
