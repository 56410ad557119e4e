"""The dry run's plan for an interrupted sweep: what Tune's saved state says each trial would do on restore."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.sweep.dry_run import restore_words, saved_trials
from pipeline.sweep.reuse import RESUME, TRAIN, TrialDecision
from pipeline.sweep.storage import StoragePath


def _state(folder: Path, trials: list[tuple[str, int, str, int | None]]) -> None:
    """An experiment state as Tune 2.60 writes it: per trial its JSON and its runtime JSON (last_result)."""
    data = [
        [
            json.dumps({"trial_id": f"t{i}", "status": status, "config": {"variant": variant, "seed": seed}}),
            json.dumps({"last_result": {"epoch": epoch} if epoch is not None else {}}),
        ]
        for i, (variant, seed, status, epoch) in enumerate(trials)
    ]
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": data}))


def test_an_interrupted_sweep_restores_resumes_and_reuses_never_trains_from_scratch(tmp_path: Path) -> None:
    _state(
        tmp_path,
        [("a", 0, "TERMINATED", 4), ("b", 0, "RUNNING", 2), ("c", 0, "PENDING", None), ("d", 0, "TERMINATED", 1)],
    )
    saved = saved_trials(StoragePath(tmp_path))
    assert saved == {("a", 0): ("TERMINATED", 4), ("b", 0): ("RUNNING", 2), ("c", 0): ("PENDING", 0),
                     ("d", 0): ("TERMINATED", 1)}  # fmt: skip
    fresh = {v: TrialDecision(v, 0, "k", TRAIN) for v in "abcd"}
    words = {v: restore_words(fresh[v], saved[(v, 0)], 4) for v in "abcd"}
    assert words["a"] == "reuse (finished before the interrupt: epoch 4)"
    assert words["b"] == "restore: resume after epoch 2 (its newest checkpoint)"
    assert words["c"] == "restore: start (not started before)"
    assert words["d"] == "reuse (finished before the interrupt: epoch 1, stopped early by ASHA)"
    earlier = TrialDecision("c", 0, "k", RESUME, run_id="r9", epoch=3)  # continues a run of an earlier sweep
    assert restore_words(earlier, saved[("c", 0)], 4) == "restore: resume run r9 from epoch 3"
    assert restore_words(earlier, None, 4) == "restore: resume run r9 from epoch 3"


def test_no_saved_state_means_nothing_known(tmp_path: Path) -> None:
    assert saved_trials(StoragePath(tmp_path)) == {}
    assert saved_trials(StoragePath(tmp_path / "missing")) == {}
