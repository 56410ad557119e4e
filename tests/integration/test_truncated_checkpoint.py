"""A restore whose trial's newest registered checkpoint no longer loads (truncated after it was saved: a full disk, a
killed copy) resumes from the older checkpoint Tune kept beside it, and says so in the stage's output, naming the file.
"""

from __future__ import annotations

import json
import signal
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.trial.report import CHECKPOINT_FILE

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def test_a_truncated_newest_checkpoint_is_skipped_on_restore_with_a_warning(
    project: Project, project_params: dict
) -> None:
    project.dvc("repro", "prepare")
    epochs = 4
    project_params["train"]["epochs"] = epochs
    project_params["sweep"].update(variants=["resnet18"], seeds=[44], fail_once_after_epoch=None)
    project.write_params(project_params)
    params = load_params(project.path / "params.yaml")
    path = project.path / "results/ray" / experiment_name(params, prepared_data_hash(params, project.path))
    # SIGTERM (a scheduler preempting the job; Ctrl-C is test_tune_pipeline.py's) once the third epoch's checkpoint
    # is saved: the stage stops as for Ctrl-C, and the restore below is the one a preempted job's next run makes.
    returncode, output = project.interrupt_tune(path, 2, signal.SIGTERM)
    assert returncode == 130, output[-3000:]
    [trial] = [d for d in path.iterdir() if d.is_dir() and list(d.glob("checkpoint_*"))]
    *older, newest = sorted(trial.glob("checkpoint_*"))
    assert older, sorted(trial.iterdir())
    truncated = []
    for directory in [*older[1:], newest]:  # only the oldest one Tune kept still loads
        file = directory / CHECKPOINT_FILE
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
        truncated.append(file)

    second = project.run("python", "-m", "stages.tune")
    output = second.stdout + second.stderr
    assert "restoring the interrupted sweep" in output
    warned = [line for line in output.splitlines() if "does not load (truncated?)" in line]
    assert warned and all(any(str(f.parent) in line for f in truncated) for line in warned), output[-3000:]
    assert f"resuming from the older checkpoint {older[0]}" in output, output[-3000:]
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    [record] = manifest["trials"]
    client = MlflowClient(manifest["tracking_uri"])
    assert record["status"] == "finished" and client.get_run(record["run_id"]).info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(record["run_id"], "test_acc")]
    assert sorted(steps) == list(range(1, epochs + 1))  # the epochs trained again are logged once
