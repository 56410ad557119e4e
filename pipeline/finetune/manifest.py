"""A fine-tune stage's manifest: its schema, writer and reader (no Ray, no MLflow: every stage can read it).

``results/<stage>/manifest.json`` (prune, transform), the analysis stage's input: the ``<stage>-<hash>`` run, the
sweep its sources come from, the recipe's rule, and one entry per model (the recipe's dataclass: where it came from,
its fine-tuning run, what the recipe did to it and what that cost). The format is the one both stages wrote before
they shared this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeline.sweep.manifest import read_manifest, write_manifest

FLOP_CONVENTIONS = {
    "paper": "2 x MACs of the Linear/Conv layers on the image (the paper's 6.2B / 4.9B), per image",
    "full": "every matmul, attention-weighted sums included, per image",
}


@dataclass
class FineTuneManifest:
    """``results/<stage>/manifest.json``; ``models`` holds the recipe's entries (``PrunedModel``, ...)."""

    experiment_name: str  # <stage>-<hash>: the Ray experiment and the MLflow parent run's name ('' when none)
    ray_experiment_path: str
    tune_experiment_name: str  # the sweep the sources come from
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    rule: dict[str, Any]  # the recipe's section and the fine-tuning lr
    models: list[Any]
    skipped: list[dict[str, str]] | None = None  # sources left out, with why ({"variant", "seed", "run_id", "reason"})
    flop_conventions: dict[str, str] = field(default_factory=lambda: dict(FLOP_CONVENTIONS))
    stage: str = ""
    PATHS: ClassVar[tuple[str, ...]] = ("ray_experiment_path",)

    def metrics_summary(self) -> dict[str, dict[str, float]]:
        """The stage's ``metrics.json``: per name an entry's ``summary`` gives (``test_acc`` is what DVC compares),
        the figures averaged over seeds; models whose fine-tuning gave no accuracy are left out."""
        per_name: dict[str, list[dict[str, float]]] = {}
        for model in self.models:
            if model.final_acc is not None:
                name, figures = model.summary()
                per_name.setdefault(name, []).append(figures)
        summary = {}
        for name, rows in sorted(per_name.items()):
            summary[name] = {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}
            summary[name]["seeds"] = len(rows)
        return summary

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.skipped is None:  # a recipe that refuses rather than skips writes no such list
            del data["skipped"]
        return data


def write_finetune_manifest(path: Path, manifest: FineTuneManifest, entry: type, project_root: Path) -> None:
    """Paths and an sqlite store inside ``project_root`` are written relative to it (``write_manifest``)."""
    write_manifest(path, manifest, "models", entry, project_root)


def read_finetune_manifest(path: Path, stage: str, entry: type, project_root: Path) -> FineTuneManifest:
    """The ``stage`` manifest at ``path`` (its models as ``entry``), paths resolved against ``project_root``; a
    missing, unreadable or incomplete file raises naming the file and what to do."""
    return read_manifest(path, FineTuneManifest, "models", entry, stage, project_root)
