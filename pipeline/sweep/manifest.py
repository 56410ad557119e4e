"""The tune stage's manifest: its schema, writer and reader, and the statuses a trial can end in.

``results/tune/manifest.json`` names the MLflow runs of the sweep (store, experiment, parent run, one run per trial)
and each trial's last checkpoint: later stages find runs by these ids, never as "the latest runs". It imports
neither Ray nor MLflow, so every stage can read it. Git-tracked, so paths (and an sqlite store) inside the project
are written relative to it and resolved on reading: a moved or cloned project reads its own.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pipeline.io import write_json_atomic

M = TypeVar("M")  # the manifest dataclass read_manifest returns

# How a trial ended. The tracking callback decides it when Tune ends the trial and tags the run (``tune.status``);
# the manifest reads it back from the run, so both always say the same.
FINISHED, EARLY_STOPPED, ERROR, INTERRUPTED = "finished", "early_stopped", "error", "interrupted"
COMPLETED = (FINISHED, EARLY_STOPPED)  # ran to the end Tune gave it: its last metrics count
STAGE = "tune"
METRIC, MODE = "test_acc", "max"  # the one place the objective is named (ASHA, best trial, progress table)


@dataclass
class TrialRecord:
    """One trial: what prune and analysis need to find its run, checkpoint and head history."""

    trial_id: str
    run_id: str | None
    run_name: str | None
    variant: str
    seed: int
    status: str  # FINISHED | EARLY_STOPPED | ERROR | INTERRUPTED
    epochs_completed: int
    metrics: dict[str, float]
    checkpoint_dir: str | None  # the last checkpoint dir (checkpoint.pt, head_history.json)
    head_history: str | None  # head_history.json (None: the model has no Gaussian heads)
    artifacts: dict[str, str] = field(default_factory=dict)  # MLflow artifact URIs of the same files
    trial_key: str | None = None  # the trial's identity (model, train config with seed, data, trial code)
    reused: bool = False  # an earlier sweep's finished run of the same identity, not trained again
    sweep_run_id: str | None = None  # the parent run of the sweep that started the run (this one or an earlier one)
    failure_reason: str | None = None  # why it failed without retries (divergence, bad config): what to change
    PATHS: ClassVar[tuple[str, ...]] = ("checkpoint_dir", "head_history")  # project-relative in the file


@dataclass
class TuneManifest:
    """``results/tune/manifest.json``."""

    params_hash: str
    experiment_name: str
    ray_experiment_path: str
    metric: str
    mode: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    trials: list[TrialRecord]
    stage: str = STAGE
    PATHS: ClassVar[tuple[str, ...]] = ("ray_experiment_path",)

    def metrics_summary(self) -> dict[str, dict[str, float]]:
        """``accuracy_summary`` of the trials: the stage's ``metrics.json`` (its ``test_acc`` the ``test_acc.json``
        that ``dvc metrics show`` and ``dvc exp show`` compare)."""
        return accuracy_summary(self.trials)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def accuracy_summary(trials: list[TrialRecord]) -> dict[str, dict[str, float]]:
    """Final test accuracy per variant: mean, count (``test_acc_n``) and std over seeds, of the trials that ran to
    their end (finished, or stopped early by ASHA)."""
    per_variant: dict[str, list[float]] = {}
    for trial in trials:
        if trial.status in COMPLETED and "test_acc" in trial.metrics:
            per_variant.setdefault(trial.variant, []).append(trial.metrics["test_acc"])
    return {
        variant: {
            "test_acc": statistics.fmean(accs),
            "test_acc_n": len(accs),
            "test_acc_std": statistics.pstdev(accs),
        }
        for variant, accs in sorted(per_variant.items())
    }


def write_tune_manifest(path: Path, manifest: TuneManifest, project_root: Path) -> None:
    write_manifest(path, manifest, "trials", TrialRecord, project_root)


def read_tune_manifest(path: Path, project_root: Path) -> TuneManifest:
    """The manifest at ``path``, its paths resolved against ``project_root``; a missing, unreadable or incomplete file
    raises naming the file and what to do."""
    return read_manifest(path, TuneManifest, "trials", TrialRecord, STAGE, project_root)


SQLITE = "sqlite:///"


def portable(value: str | None, project_root: Path) -> str | None:
    """A path, or an sqlite store's URI, inside ``project_root`` made relative to it (POSIX form); anything else (a
    path outside it, a bucket, a server) as given."""
    if value and value.startswith(SQLITE):
        return SQLITE + str(portable(value.removeprefix(SQLITE), project_root))
    if not value or "://" in value or not Path(value).is_absolute():
        return value
    absolute, root = Path(value).resolve(), project_root.resolve()
    return absolute.relative_to(root).as_posix() if absolute.is_relative_to(root) else value


def resolved(value: str | None, project_root: Path) -> str | None:
    """A manifest's path, or sqlite store's URI, made absolute: a relative one lies in ``project_root`` (not the
    cwd); anything else as given."""
    if value and value.startswith(SQLITE):
        return SQLITE + str(resolved(value.removeprefix(SQLITE), project_root))
    relative = value and "://" not in value and not Path(value).is_absolute()
    return str(project_root.resolve() / value) if relative else value


def _convert(raw: dict[str, Any], cls: type, items: str, item_cls: type, convert: Any) -> dict[str, Any]:
    """``raw`` (a manifest as JSON) with ``convert`` applied to its path fields and its tracking URI."""

    def paths(record: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        return {**record, **{name: convert(record[name]) for name in names if name in record}}

    converted = paths(raw, (*cls.PATHS, "tracking_uri"))
    converted[items] = [paths(record, item_cls.PATHS) for record in raw[items]]
    return converted


def write_manifest(path: Path, manifest: Any, items: str, item_cls: type, project_root: Path) -> None:
    """Write a stage's manifest atomically with its paths and sqlite store made relative to ``project_root``."""
    converted = _convert(manifest.to_json(), type(manifest), items, item_cls, lambda v: portable(v, project_root))
    write_json_atomic(path, converted)


def read_manifest(path: Path, cls: type[M], items: str, item_cls: type, stage: str, project_root: Path) -> M:
    """A stage's manifest as ``cls`` (its list ``items`` of ``item_cls``), paths resolved against ``project_root``; a
    missing, unreadable or incomplete file raises naming the file and the stage to run."""
    path = Path(path)
    hint = f"run the {stage} stage first (`dvc repro {stage}`)"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {stage} manifest; {hint}")
    try:
        raw = _convert(json.loads(path.read_text()), cls, items, item_cls, lambda v: resolved(v, project_root))
        records = [item_cls(**_known(item_cls, item)) for item in raw[items]]
        return cls(**{**_known(cls, raw), items: records})
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a {stage} manifest ({type(err).__name__}: {err}); {hint}") from None


def _known(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` present in ``raw`` (a newer writer may add fields; a missing one raises TypeError)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in raw.items() if k in names}
