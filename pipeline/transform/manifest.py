"""The transform stage's manifest: its schema, writer and reader.

``results/transform/manifest.json`` is the transform stage's DVC output and the analysis stage's input: per converted
network (``t_resnet18`` of each seed), the ResNet18 run it was built from, its fine-tuning run, how exact the
conversion was before any training (test accuracy of both, the largest logit difference in float32 and float64), the
layers converted, params and FLOPs in both conventions, and the accuracy after fine-tuning. Imports neither Ray nor
MLflow, so every stage can read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeline.prune.manifest import FLOP_CONVENTIONS
from pipeline.sweep.manifest import read_manifest, write_manifest

STAGE = "transform"


@dataclass
class TransformedModel:
    """One trained ResNet18 rebuilt as attention, then fine-tuned."""

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


@dataclass
class TransformManifest:
    """``results/transform/manifest.json``."""

    experiment_name: str  # transform-<hash>: the Ray experiment and the MLflow parent run's name ('' when none)
    ray_experiment_path: str
    tune_experiment_name: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    rule: dict[str, Any]  # the transform section, the fine-tuning lr and the construction's alpha
    models: list[TransformedModel]
    flop_conventions: dict[str, str] = field(default_factory=lambda: dict(FLOP_CONVENTIONS))
    stage: str = STAGE
    PATHS: ClassVar[tuple[str, ...]] = ("ray_experiment_path",)

    def metrics_summary(self) -> dict[str, dict[str, float]]:
        """Per transform variant (the stage's ``metrics.json``; ``test_acc`` alone, its ``test_acc.json``, is what DVC
        compares): test accuracy before any training (equal to the source's
        ``test_acc`` in ``results/tune/metrics.json``) and after fine-tuning, averaged over seeds."""
        per_name: dict[str, list[TransformedModel]] = {}
        for model in self.models:
            if model.test_acc is not None:
                per_name.setdefault(model.name, []).append(model)
        return {
            name: {
                "test_acc_step0": sum(m.test_acc_step0 for m in models) / len(models),
                "test_acc": sum(m.test_acc or 0.0 for m in models) / len(models),
                "seeds": len(models),
            }
            for name, models in sorted(per_name.items())
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_transform_manifest(path: Path, manifest: TransformManifest, project_root: Path) -> None:
    """Paths and an sqlite store inside ``project_root`` are written relative to it (``write_manifest``)."""
    write_manifest(path, manifest, "models", TransformedModel, project_root)


def read_transform_manifest(path: Path, project_root: Path) -> TransformManifest:
    """The manifest at ``path``, its paths resolved against ``project_root``; a bad file raises naming it."""
    return read_manifest(path, TransformManifest, "models", TransformedModel, STAGE, project_root)
