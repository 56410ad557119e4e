"""The drain watch and the drain checkpoint, without a cluster: Ray's draining nodes faked, storage a local folder
(the cluster test, ``tests/cluster/test_gpu_nodes.py``, drains a real node)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray
import torch

from pipeline.trial.checkpoint import EpochProgress
from pipeline.trial.preemption import DRAIN_MARKER, DrainWatch, drained_checkpoint, save_drain_checkpoint
from pipeline.trial.report import CHECKPOINT_FILE

NODE = "ab" * 28


@pytest.fixture
def draining(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The cluster's draining nodes as ``DrainWatch`` reads them: edit the dict to drain a node."""
    nodes: dict[str, int] = {}
    monkeypatch.setattr(ray._private.state.state, "get_draining_nodes", lambda: dict(nodes))
    return nodes


def _wait(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_watch_notices_its_own_node_only(draining: dict[str, int]) -> None:
    with DrainWatch(NODE, poll_s=0.02) as watch:
        draining["cd" * 28] = 0  # another node
        assert not _wait(watch.noticed, timeout_s=0.2)
        draining[NODE] = 1_234_000
        assert _wait(watch.noticed)
    assert watch.deadline_ms == 1_234_000


def test_a_failing_poll_is_no_notice_and_the_watch_keeps_looking(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([RuntimeError("GCS unavailable"), {NODE: 0}])

    def flaky() -> dict[str, int]:
        answer = next(answers, {NODE: 0})
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ray._private.state.state, "get_draining_nodes", flaky)
    with DrainWatch(NODE, poll_s=0.02) as watch:
        assert _wait(watch.noticed)


def test_a_node_that_outlives_its_deadline_lets_the_trial_go_on(draining: dict[str, int]) -> None:
    draining[NODE] = int(time.time() * 1000) + 100  # 0.1 s of notice
    with DrainWatch(NODE, poll_s=0.02) as watch:
        assert _wait(watch.noticed)
        started = time.monotonic()
        watch.await_the_end(grace_s=0.2)
    assert 0.1 < time.monotonic() - started < 2


def _mid_epoch_checkpoint(directory: Path, epoch: int, steps: int) -> Path:
    directory.mkdir(parents=True)
    progress = EpochProgress(torch.zeros(8, dtype=torch.uint8), steps, 1.5, 3, 0.1)
    torch.save({"epoch": epoch, "epoch_progress": progress.state()}, directory / CHECKPOINT_FILE)
    return directory


def test_the_drain_checkpoint_is_resumed_unless_tune_checkpointed_past_it(tmp_path: Path) -> None:
    fs, trial = pafs.LocalFileSystem(), str(tmp_path / "trial")
    marker = save_drain_checkpoint(_mid_epoch_checkpoint(tmp_path / "local", 2, 7), fs, trial)
    assert marker == {"epoch": 2, "steps": 7, "checkpoint": "drain_checkpoint_e2_s7"}
    assert (tmp_path / "trial" / DRAIN_MARKER).is_file()
    found = drained_checkpoint(fs, trial, 2, tmp_path / "down")
    assert found is not None and torch.load(found / CHECKPOINT_FILE)["epoch_progress"]["steps"] == 7
    # Tune's newest checkpoint lags behind (sweep.checkpoint_interval_s > 0: epochs reported without one, or none
    # yet): the drain's is the newer state of the trial and wins.
    for lagging in (1, 0):
        found = drained_checkpoint(fs, trial, lagging, tmp_path / f"lagging-{lagging}")
        assert found is not None and torch.load(found / CHECKPOINT_FILE)["epoch"] == 2
    # Tune's newest checkpoint is past it (epoch 3 done since): stale.
    assert drained_checkpoint(fs, trial, 3, tmp_path / "later") is None
    assert drained_checkpoint(fs, str(tmp_path / "no-trial"), 2, tmp_path / "none") is None


def test_a_drain_checkpoint_that_does_not_load_is_not_resumed(tmp_path: Path, caplog) -> None:
    fs, trial = pafs.LocalFileSystem(), str(tmp_path / "trial")
    marker = save_drain_checkpoint(_mid_epoch_checkpoint(tmp_path / "local", 1, 4), fs, trial)
    saved = tmp_path / "trial" / marker["checkpoint"] / CHECKPOINT_FILE
    saved.write_bytes(saved.read_bytes()[:20])
    assert drained_checkpoint(fs, trial, 1, tmp_path / "down") is None
    assert "does not load" in caplog.text
