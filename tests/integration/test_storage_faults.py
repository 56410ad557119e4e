"""A full disk under ``sweep.storage_path``, on the real tools: a small tmpfs mounted as the Ray storage, the session's
Ray and MLflow server, the tune stage as a subprocess.

The tmpfs is nearly filled before the sweep, so the first checkpoints no longer fit. The stage must end in one line
naming the storage and what to do (no retries of a full disk, no traceback from inside Ray), every run closed with a
reason; once space is freed, a re-run continues the sweep: every trial once, every epoch once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
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

EPOCHS = 2
FREE_BYTES = 64 * 1024  # left free on the tmpfs: the sweep's first files fit, its first checkpoints do not


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``where``; None when done, else why it could not be (not root, no mount rights in
    this container)."""
    where.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None:
        return "no mount command"
    done = subprocess.run([mount, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        return f"mounting a tmpfs is not permitted here ({done.stderr.decode().strip() or done.returncode})"
    return None


@pytest.fixture
def full_storage(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs with all but ``FREE_BYTES`` taken by ``filler`` (remove it to free the space)."""
    where = tmp_path / "storage"
    why = _mount_tmpfs(where, "3m")
    if why is not None:
        pytest.skip(f"needs a small tmpfs as storage: {why}")
    try:
        free = os.statvfs(where)
        with (where / "filler").open("wb") as filler:
            filler.write(b"\0" * (free.f_bavail * free.f_frsize - FREE_BYTES))
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _tune(project: Project) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["python", "-m", "stages.tune"], cwd=project.path, env=project.env, capture_output=True, text=True, timeout=300
    )


def test_a_full_storage_ends_in_one_line_and_a_rerun_continues(
    project: Project, project_params: dict, full_storage: Path
) -> None:
    project.dvc("repro", "prepare")
    project_params["train"]["epochs"] = EPOCHS
    project_params["sweep"].update(  # seed 29: trials no other test trains (a re-run must continue them, not reuse)
        storage_path=str(full_storage), seeds=[29], fail_once_after_epoch=None, max_failures=2
    )
    project.write_params(project_params)
    params = load_params(project.path / "params.yaml")
    path = full_storage / experiment_name(params, prepared_data_hash(params, project.path))

    done = _tune(project)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert str(full_storage) in last and "No space left on device" in last, last
    assert "free space" in last and "sweep.storage_path" in last, last
    assert "EOFError" not in output and not tracebacks(output.split("stages.tune")[-1]), output[-3000:]
    record = json.loads((path / "mlflow_parent_run.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    parent = client.get_run(record["parent_run_id"])
    assert parent.info.status == "KILLED", parent.info.status
    assert "No space left on device" in parent.data.tags["tune.stop_reason"]
    children = client.search_runs([record["experiment_id"]], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert children
    for run in children:
        assert run.info.status == "KILLED", (run.info.run_name, run.info.status)
        assert "No space left on device" in run.data.tags["tune.stop_reason"]
    assert "continues run" not in output  # not retried: a full disk does not empty itself

    (full_storage / "filler").unlink()
    done = _tune(project)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    assert [t["status"] for t in manifest["trials"]] == ["finished"] * len(params.sweep.variants)
    keys = [t["trial_key"] for t in manifest["trials"]]
    for key in keys:
        runs = client.search_runs([manifest["experiment_id"]], f"tags.`trial_key` = '{key}'")
        assert len(runs) == 1, [r.info.run_id for r in runs]  # continued, not a second run
        steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "test_acc")]
        assert sorted(steps) == list(range(1, EPOCHS + 1)), steps  # each epoch once
