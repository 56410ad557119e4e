"""A trial's Ray worker killed at any moment of its life costs that trial one attempt, never the sweep, and the stage's
summary says so: a worker SIGKILLed while Ray constructs the trial's actor, and workers Ray's own memory monitor kills
(``OutOfMemoryError``, which Ray Tune 2.60 alone turns into "Caught unexpected exception" and the sweep's end)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING

import psutil
import pytest
from mlflow.tracking import MlflowClient

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow

CONSTRUCTING = "ray::ImplicitFunc.__init__"  # the process title Ray gives a worker constructing a trial's actor


def _kill_first_constructing_actor(stage: subprocess.Popen, timeout_s: float = 120) -> int:
    """SIGKILL the first worker of this test session's Ray (a descendant of this process) seen constructing a trial's
    actor; its pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and stage.poll() is None:
        for process in psutil.Process().children(recursive=True):
            try:
                title = " ".join(process.cmdline()).strip()
            except psutil.Error:
                continue
            if title == CONSTRUCTING:
                os.kill(process.pid, signal.SIGKILL)
                return process.pid
        time.sleep(0.02)
    stage.kill()
    raise AssertionError(f"no {CONSTRUCTING} seen:\n{stage.communicate()[0][-3000:]}")


def test_a_worker_killed_while_its_actor_is_constructed_costs_one_attempt(
    project: Project, project_params: dict
) -> None:
    project.dvc("repro", "prepare")
    project_params["train"]["epochs"] = 1
    project_params["sweep"].update(variants=["sa_quadratic_9"], seeds=[41], max_failures=1, fail_once_after_epoch=None)
    project.write_params(project_params)
    stage = project.start_tune()
    _kill_first_constructing_actor(stage)
    output, _ = stage.communicate(timeout=240)
    assert stage.returncode == 0, output[-4000:]
    assert "Caught unexpected exception" not in output
    summary = "sa_quadratic_9 seed 41: 1 failed attempt, retried (last: The actor died unexpectedly"
    assert summary in output, output[-3000:]
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    [trial] = manifest["trials"]
    assert trial["status"] == "finished"
    run = MlflowClient(manifest["tracking_uri"]).get_run(trial["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["tune.retries"] == "1"


def test_workers_the_memory_monitor_kills_cost_one_attempt_each(project: Project, project_params: dict) -> None:
    """The stage's own local Ray, with a memory threshold every worker exceeds: the monitor kills each attempt of the
    trial, while its actor is constructed or while it trains (its refresh period against the attempt's length decides
    which; Tune 2.60 alone ends the sweep on a kill while training). Each kill is one failed attempt; with
    ``max_failures: 1`` the trial fails after two, and the stage ends as for any trial that failed its retries."""
    project.dvc("repro", "prepare")
    project_params["train"]["epochs"] = 50  # long enough that a kill lands while it trains
    project_params["sweep"].update(variants=["sa_quadratic_9"], seeds=[42], max_failures=1, fail_once_after_epoch=None)
    project.write_params(project_params)
    env = {key: value for key, value in project.env.items() if key != "RAY_ADDRESS"}
    env.update(RAY_memory_usage_threshold="0.01", RAY_memory_monitor_refresh_ms="5000")
    done = subprocess.run(
        ["python", "-m", "stages.tune"], cwd=project.path, env=env, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    assert "Caught unexpected exception" not in output, output[-4000:]
    [summary] = [line for line in output.splitlines() if "sa_quadratic_9 seed 42: 2 failed attempts" in line]
    assert "no retry left" in summary and "running low on memory" in summary, summary
    assert "some trials failed after their retries" in output
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    [trial] = manifest["trials"]
    assert trial["status"] == "error"
