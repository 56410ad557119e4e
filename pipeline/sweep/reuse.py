"""Which trials of a sweep already exist: reuse a finished run, resume an unfinished one from its checkpoint, or train.

Researchers grow sweeps step by step, and a trial's result depends only on its identity (``identity.trial_key``, the
``trial_key`` tag of its MLflow run). A FINISHED run that trained all ``train.epochs`` and uploaded its checkpoint is
**reused**; else a run that stopped early whose Ray trial folder (``ray.trial_path``) holds a checkpoint that loads is
**resumed** in the same run (one run per identity however many ``dvc repro`` it took); anything else **trains**
(``sweep.retrain``: everything).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.sweep.checkpoints import newest_checkpoint
from pipeline.sweep.manifest import FINISHED
from pipeline.sweep.storage import StoragePath, found_file
from pipeline.sweep.tracking import Store, tags
from pipeline.trial.report import CHECKPOINT_FILE

REUSE, RESUME, TRAIN = "reuse", "resume", "train"
DECISIONS_FILE = "sweep_plan.json"  # in the Ray experiment dir: the decisions a restored run continues with


@dataclass(frozen=True)
class TrialDecision:
    """What a stage does with one trial (variant, seed): reuse ``run_id``, resume it from ``checkpoint_dir`` (after
    ``epoch`` epochs), or train."""

    variant: str
    seed: int
    key: str
    action: str  # REUSE | RESUME | TRAIN
    run_id: str | None = None
    checkpoint_dir: str | None = None
    epoch: int = 0

    @property
    def trains(self) -> bool:
        """Whether Tune runs it (trained or resumed), as opposed to reused."""
        return self.action != REUSE

    def words(self) -> str:
        """How the dry run and the log say it."""
        if self.action == REUSE:
            return f"reuse run {self.run_id}"
        if self.action == RESUME:
            return f"resume run {self.run_id} from epoch {self.epoch}"
        return "train"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_complete(run: Any, epochs: int) -> bool:
    """The run trained all its epochs, ended normally and uploaded its final checkpoint."""
    run_tags = run.data.tags
    return (
        run.info.status == "FINISHED"
        and run_tags.get(tags.STATUS_TAG) == FINISHED
        and run_tags.get(tags.LAST_EPOCH_TAG) == str(epochs)
        and tags.CHECKPOINT_TAG in run_tags
    )


def decide(variant: str, seed: int, key: str, runs: list[Any], epochs: int, *, retrain: bool = False) -> TrialDecision:
    """Reuse the newest complete run (``checkpoint_dir``: its Ray checkpoint when still on disk), else resume the
    furthest unfinished run from its newest valid checkpoint, else train."""
    if retrain:
        return TrialDecision(variant, seed, key, TRAIN)
    for run in runs:
        if is_complete(run, epochs):  # its checkpoint is in MLflow; the Ray copy may have been deleted
            checkpoint = run.data.tags[tags.CHECKPOINT_TAG]
            local = checkpoint if found_file(StoragePath(checkpoint) / CHECKPOINT_FILE) else None
            return TrialDecision(variant, seed, key, REUSE, run.info.run_id, local, epochs)
    best: TrialDecision | None = None
    for run in runs:
        trial_path = run.data.tags.get(tags.TRIAL_PATH_TAG)
        if not trial_path:
            continue
        found = newest_checkpoint(StoragePath(trial_path))
        if found is not None and 0 < found[1] < epochs and (best is None or found[1] > best.epoch):
            best = TrialDecision(variant, seed, key, RESUME, run.info.run_id, str(found[0]), found[1])
    return best or TrialDecision(variant, seed, key, TRAIN)


def decide_trials(
    uri: str,
    experiment_id: str | None,
    trials: list[tuple[str, int, str]],
    epochs: int,
    *,
    retrain: bool = False,
    store: Store | None = None,
    seen: dict[str, Any] | None = None,
) -> list[TrialDecision]:
    """The decision for every (variant, seed, key), from one paged search for all keys (``store.find_runs``); ``seen``
    receives the runs read, so the reused trials' records need no request of their own."""
    if experiment_id is None or retrain:
        return [TrialDecision(variant, seed, key, TRAIN) for variant, seed, key in trials]
    runs = (store or Store(uri)).find_runs(experiment_id, (key for _, _, key in trials))
    if seen is not None:
        seen.update({run.info.run_id: run for found in runs.values() for run in found})
    return [decide(variant, seed, key, runs[key], epochs) for variant, seed, key in trials]


def write_decisions(experiment_dir: StoragePath, decisions: list[TrialDecision]) -> None:
    """Kept next to the Ray experiment: a restored run lists the same reused runs as the run that decided them."""
    payload = [decision.to_dict() for decision in decisions]
    (experiment_dir / DECISIONS_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_decisions(experiment_dir: StoragePath) -> list[TrialDecision] | None:
    path = experiment_dir / DECISIONS_FILE
    return [TrialDecision(**item) for item in json.loads(path.read_text())] if path.is_file() else None
