"""Faults a user's machine meets, on the real tools (the session's Ray and MLflow server, the stage as a subprocess):
Ctrl-C while trials are still pending, and a trial whose failure a retry cannot fix (divergence)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from tests.tracebacks import tracebacks

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def _tune(project: Project) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["python", "-m", "stages.tune"], cwd=project.path, env=project.env, capture_output=True, text=True, timeout=300
    )


def _experiment_dir(project: Project) -> Path:
    params = load_params(project.path / "params.yaml")
    return project.path / "results/ray" / experiment_name(params, prepared_data_hash(params, project.path))


def test_ctrl_c_while_trials_are_pending_stops_cleanly(project: Project, project_params: dict) -> None:
    """Each trial takes the Ray's 2 CPUs: one trains, the other is still PENDING when Ctrl-C comes."""
    project.dvc("repro", "prepare")
    project_params["train"]["epochs"] = 20
    project_params["sweep"].update(resources={"cpu": 2, "gpu": 0}, fail_once_after_epoch=None)
    project.write_params(project_params)
    path = _experiment_dir(project)
    returncode, output = project.interrupt_tune(path, 0, timeout_s=180)
    assert returncode == 130, output[-3000:]
    assert not tracebacks(output) and "TypeError" not in output, output[-3000:]
    assert "sweep interrupted" in output
    record = json.loads((path / "mlflow_parent_run.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    runs = client.search_runs([record["experiment_id"]], f"tags.`mlflow.parentRunId` = '{record['parent_run_id']}'")
    assert len(runs) == 1 and runs[0].info.status == "KILLED"  # the pending trial never opened a run
    assert client.get_run(record["parent_run_id"]).info.status == "KILLED"


def test_a_diverging_trial_fails_once_and_says_what_to_change(project: Project, project_params: dict) -> None:
    """At lr 5 the self-attention model's loss becomes NaN in epoch 1 while ResNet18 trains on (it diverges too at
    lr 10 on the 8x8 digits; the self-attention model already at 3)."""
    project.dvc("repro", "prepare")
    project_params["train"].update(lr=5.0, epochs=2)
    project_params["sweep"].update(max_failures=1, fail_once_after_epoch=None)  # each attempt starts a Ray worker
    project.write_params(project_params)
    done = _tune(project)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "sa_quadratic_9 seed 0 failed, not retried: training diverged" in output and "lower train.lr" in output
    assert "re-run to resume" not in output  # a re-run would fail the same way
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    trials = {t["variant"]: t for t in manifest["trials"]}
    assert trials["resnet18"]["status"] == "finished" and trials["resnet18"]["failure_reason"] is None
    diverged = trials["sa_quadratic_9"]
    assert diverged["status"] == "error" and diverged["failure_reason"].startswith("training diverged: loss is nan")
    run = MlflowClient(manifest["tracking_uri"]).get_run(diverged["run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["tune.failure_reason"] == diverged["failure_reason"]
    assert run.data.tags["mlflow.note.content"].startswith("Failed once, not retried")
    # Trained once: Tune's retries re-raised the recorded failure without training (the DivergedError is raised once).
    failures = next(_experiment_dir(project).glob("*/error.txt")).read_text().split("Failure # ")[1:]
    assert ["DivergedError" in failure for failure in failures] == [True, False], failures


def test_results_unwritable_mid_run_ends_with_one_line(project: Project, project_params: dict) -> None:
    """``results/tune`` stops being writable while trials train (here a file takes its place: the tests run as root,
    which permission bits do not stop): one line naming it, exit 1, every run closed, retries counted once."""
    project.dvc("repro", "prepare")
    project_params["train"]["epochs"] = 3  # each trial fails once after epoch 1 (the project's profile) and retries
    project.write_params(project_params)
    path, out = _experiment_dir(project), project.path / "results/tune"
    aside = project.path / "results/tune.aside"
    stage = project.start_tune()
    try:
        deadline = time.monotonic() + 180
        while not list(path.glob("*/checkpoint_000000")):
            assert stage.poll() is None and time.monotonic() < deadline, stage.communicate()[0][-3000:]
            time.sleep(0.1)
        if out.exists():
            out.rename(aside)
        out.write_text("not a folder")
        output, _ = stage.communicate(timeout=240)
    finally:
        if out.is_file():  # what the test put there (a failure before that leaves the real folder in place)
            out.unlink()
        if aside.exists():
            aside.rename(out)
    assert stage.returncode == 1, output[-3000:]
    # (Ray prints the traceback of each trial's injected failure; the stage itself ends without one.)
    assert "FileExistsError" not in output and "stages/tune.py" not in output, output[-3000:]
    assert "cannot write results/tune (File exists)" in output.splitlines()[-1]
    record = json.loads((path / "mlflow_parent_run.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    assert client.get_run(record["parent_run_id"]).info.status == "FINISHED"
    runs = client.search_runs([record["experiment_id"]], f"tags.`mlflow.parentRunId` = '{record['parent_run_id']}'")
    assert len(runs) == 2
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["tune.status"] == "finished"
        assert run.data.tags["tune.retries"] == "1"
