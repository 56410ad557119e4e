"""The tune stage's manifest: its schema, writer and reader, and the statuses a trial can end in.

``results/tune/manifest.json`` is the tune stage's DVC output and the prune and analysis stages' input: it names the
MLflow runs of the sweep (tracking URI, experiment, parent run, one run per trial) and each trial's last checkpoint.
Later stages read it through ``read_tune_manifest`` and find runs by these ids, never as "the latest runs". This module
imports neither Ray nor MLflow, so every stage can read the manifest.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from pipeline.io import write_json_atomic

M = TypeVar("M")  # the manifest dataclass read_manifest returns

# How a trial ended. The tracking callback decides it when Tune ends the trial and tags the run (``tune.status``);
# the manifest reads it back from the run, so both always say the same.
FINISHED, EARLY_STOPPED, ERROR, INTERRUPTED = "finished", "early_stopped", "error", "interrupted"
COMPLETED = (FINISHED, EARLY_STOPPED)  # ran to the end Tune gave it: its last metrics count
STAGE = "tune"


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
    checkpoint_dir: str | None  # absolute path of the last checkpoint dir (checkpoint.pt, head_history.json)
    head_history: str | None  # absolute path of head_history.json (None: the model has no Gaussian heads)
    artifacts: dict[str, str] = field(default_factory=dict)  # MLflow artifact URIs of the same files
    trial_key: str | None = None  # the trial's identity (model, train config with seed, data, trial code)
    reused: bool = False  # an earlier sweep's finished run of the same identity, not trained again
    sweep_run_id: str | None = None  # the parent run of the sweep that started the run (this one or an earlier one)
    failure_reason: str | None = None  # why it failed without retries (divergence, bad config): what to change


@dataclass
class TuneManifest:
    """``results/tune/manifest.json``."""

    params_hash: str
    experiment_name: str
    ray_experiment_path: str
    restored: bool  # this run continued an interrupted sweep
    metric: str
    mode: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    trials: list[TrialRecord]
    stage: str = STAGE

    def metrics_summary(self) -> dict[str, dict[str, float]]:
        """Final test accuracy per variant: mean, count (``test_acc_n``) and std over seeds, of the trials that ran to
        their end (finished, or stopped early by ASHA); for ``dvc metrics show``. Every key starts with ``test_acc``
        so the mean is the first column ``dvc exp show`` gives a variant (the file's keys are written sorted)."""
        per_variant: dict[str, list[float]] = {}
        for trial in self.trials:
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_tune_manifest(path: Path, manifest: TuneManifest) -> None:
    write_json_atomic(path, manifest.to_json())


def read_tune_manifest(path: Path) -> TuneManifest:
    """The manifest at ``path``; a missing, unreadable or incomplete file raises naming the file and what to do."""
    return read_manifest(path, TuneManifest, "trials", TrialRecord, STAGE)


def read_manifest(path: Path, cls: type[M], items: str, item_cls: type, stage: str) -> M:
    """A stage's manifest: the dataclass ``cls`` whose list field ``items`` holds ``item_cls`` records. A missing,
    unreadable or incomplete file raises naming the file and the stage to run; fields a newer writer added are
    ignored."""
    path = Path(path)
    hint = f"run the {stage} stage first (`dvc repro {stage}`)"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {stage} manifest; {hint}")
    try:
        raw = json.loads(path.read_text())
        records = [item_cls(**_known(item_cls, item)) for item in raw[items]]
        return cls(**{**_known(cls, raw), items: records})
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a {stage} manifest ({type(err).__name__}: {err}); {hint}") from None


def _known(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` present in ``raw`` (a newer writer may add fields; a missing one raises TypeError)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in raw.items() if k in names}
