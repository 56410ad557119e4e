"""Two tune (or prune) stages at once in one project: the second refuses at once, naming the running one; the lock
goes away with the process that held it, however it ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.sweep.lock import StageRunningError, hold_stage_lock

ROOT = Path(__file__).resolve().parents[4]
HOLD = (
    "import sys, time; from pipeline.sweep.lock import hold_stage_lock; hold_stage_lock(sys.argv[1], sys.argv[2]); "
    "print('held', flush=True); time.sleep(600)"
)


def _holder(lock: Path, stage: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock), stage], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


@pytest.mark.parametrize("stage", ["tune", "prune"])
def test_a_second_stage_refuses_naming_the_running_one(tmp_path: Path, stage: str) -> None:
    holder = _holder(tmp_path / f"results/.{stage}.lock", stage)
    try:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", f"stages.{stage}", "--params", str(ROOT / "params.yaml")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        seconds = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"the {stage} stage is already running in this project (pid {holder.pid}, started " in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "results" / stage).exists()  # nothing was started
    assert seconds < 60, seconds


def test_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "results/.tune.lock"
    holder = _holder(lock, "tune")
    holder.kill()  # SIGKILL: no clean-up code runs, the OS releases the flock
    holder.wait()
    hold_stage_lock(lock, "tune")  # no stale lock to delete by hand
    assert lock.read_text().startswith("pid ")
    again = subprocess.run(
        [sys.executable, "-c", HOLD, str(lock), "tune"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert again.returncode != 0 and StageRunningError.__name__ in again.stderr  # this process holds it now
    assert f"(pid {os.getpid()}, started " in again.stderr
