"""The prune stage's manifest: its schema, writer and reader (no Ray, no MLflow: every stage can read it).

``results/prune/manifest.json``, the analysis stage's input: per pruned model, the run it came from, its fine-tuning
run (a child of the ``prune-<hash>`` parent), which heads were cut and why, what that saved (params and FLOPs, both
conventions) and what it cost (test accuracy before pruning, right after, after fine-tuning).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeline.sweep.manifest import read_manifest, write_manifest

STAGE = "prune"
FLOP_CONVENTIONS = {
    "paper": "2 x MACs of the Linear/Conv layers on the image (the paper's 6.2B / 4.9B), per image",
    "full": "every matmul, attention-weighted sums included, per image",
}


@dataclass
class PrunedModel:
    """One pruned and fine-tuned model."""

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


@dataclass
class PruneManifest:
    """``results/prune/manifest.json``."""

    experiment_name: str  # prune-<hash>: the Ray experiment and the MLflow parent run's name
    ray_experiment_path: str
    tune_experiment_name: str  # the sweep the sources come from
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    rule: dict[str, Any]  # mode, thresholds or fraction, lr_factor, epochs
    models: list[PrunedModel]
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"variant", "seed", "run_id", "reason"}
    flop_conventions: dict[str, str] = field(default_factory=lambda: dict(FLOP_CONVENTIONS))
    stage: str = STAGE
    PATHS: ClassVar[tuple[str, ...]] = ("ray_experiment_path",)

    def metrics_summary(self) -> dict[str, dict[str, float]]:
        """Per pruned variant (``<variant>_pruned``), the stage's ``metrics.json``: test accuracy right after pruning
        and after fine-tuning (``test_acc``, what DVC compares), averaged over seeds; only what this stage measures."""
        per_variant: dict[str, list[PrunedModel]] = {}
        for model in self.models:
            if model.acc_after_finetune is not None:
                per_variant.setdefault(f"{model.variant}_pruned", []).append(model)
        summary = {}
        for name, models in sorted(per_variant.items()):
            n = len(models)
            summary[name] = {
                "acc_after_pruning": sum(m.acc_after_pruning for m in models) / n,
                "test_acc": sum(m.acc_after_finetune or 0.0 for m in models) / n,
                "seeds": n,
            }
        return summary

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_prune_manifest(path: Path, manifest: PruneManifest, project_root: Path) -> None:
    """Paths and an sqlite store inside ``project_root`` are written relative to it (``write_manifest``)."""
    write_manifest(path, manifest, "models", PrunedModel, project_root)


def read_prune_manifest(path: Path, project_root: Path) -> PruneManifest:
    """The manifest at ``path``, its paths resolved against ``project_root``; a missing, unreadable or incomplete file
    raises naming the file and what to do."""
    return read_manifest(path, PruneManifest, "models", PrunedModel, STAGE, project_root)
