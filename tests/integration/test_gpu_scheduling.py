"""GPU trials scheduled without a GPU: the session's Ray declares 2 GPUs it does not have, the tune stage
runs the sweep with ``sweep.resources.gpu`` 1 and 0.5, and the MLflow runs say which GPU Ray gave each trial
(``ray.gpu_ids``), what the trial saw (``cuda_visible_devices``) and when Tune held it (from the run's creation to
its last epoch's metrics). Without ``sweep.resources.cpu_fallback`` a trial given a GPU that finds no CUDA fails in
one line instead of training on the CPU."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def _gpu_sweep(project: Project, params: dict, gpu: float, seeds: list[int], **resources: object) -> tuple[int, str]:
    """The tune stage over ``seeds`` x the tiny profile's 2 variants, each trial asking ``gpu`` GPUs and half a CPU
    (so CPUs never limit how many run at once); its exit code and output."""
    project.dvc("repro", "prepare")
    params["sweep"].update(
        resources={"cpu": 0.5, "gpu": gpu, **resources},
        seeds=seeds,  # seeds no other test trains: each trial must really run here
        max_concurrent_trials=8,
        fail_once_after_epoch=None,
    )
    project.write_params(params)
    done = subprocess.run(
        ["python", "-m", "stages.tune"], cwd=project.path, env=project.env, capture_output=True, text=True, timeout=400
    )
    return done.returncode, done.stdout + done.stderr


def _trial_runs(project: Project) -> tuple[list, MlflowClient]:
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    assert all(t["status"] == "finished" and not t["reused"] for t in manifest["trials"]), manifest["trials"]
    client = MlflowClient(manifest["tracking_uri"])
    return [client.get_run(t["run_id"]) for t in manifest["trials"]], client


def _most_at_once(windows: list[tuple[int, int]]) -> int:
    """The most of ``windows`` (start, end) open at one instant."""
    events = sorted([(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows])  # an end before a start
    most = current = 0
    for _, change in events:
        current += change
        most = max(most, current)
    return most


@pytest.fixture
def gpus(ray_address: str) -> int:
    """The GPUs the session's Ray declares (tests/integration/conftest.py)."""
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def _per_gpu(runs: list, gpus: int, client: MlflowClient) -> dict[str, list[tuple[int, int]]]:
    """Each trial's window on its GPU, by the GPU Ray gave it: from its run's creation (the driver, when Tune starts
    the trial) to its last epoch's metrics (the driver, when the last report came; not the run's end, which follows
    the model's logging on the driver's background thread, after Tune has freed the GPU). Checks each trial saw
    exactly that GPU and no CUDA."""
    windows: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for run in runs:
        tags = run.data.tags
        assert tags["ray.gpu_ids"] in {str(i) for i in range(gpus)}, tags  # one GPU, one Ray declared
        assert tags["cuda_visible_devices"] == tags["ray.gpu_ids"], tags  # Ray's remapping reached the trial
        assert tags["device"] == "cpu", tags  # no CUDA here: trained on the CPU, as cpu_fallback allowed
        last_report = max(m.timestamp for m in client.get_metric_history(run.info.run_id, "test_acc"))
        windows[tags["ray.gpu_ids"]].append((run.info.start_time, last_report))
    return windows


def test_one_gpu_per_trial_runs_one_trial_per_gpu(project: Project, project_params: dict, gpus: int) -> None:
    returncode, output = _gpu_sweep(project, project_params, 1, [41, 42], cpu_fallback=True)
    assert returncode == 0, output[-3000:]
    runs, client = _trial_runs(project)
    windows = _per_gpu(runs, gpus, client)
    assert len(runs) == 4 and set(windows) == {"0", "1"}  # the first two trials start together, one on each GPU
    assert all(_most_at_once(w) == 1 for w in windows.values()), windows
    assert _most_at_once([w for ws in windows.values() for w in ws]) == gpus


def test_half_a_gpu_per_trial_packs_two_trials_per_gpu(project: Project, project_params: dict, gpus: int) -> None:
    returncode, output = _gpu_sweep(project, project_params, 0.5, [43, 44], cpu_fallback=True)
    assert returncode == 0, output[-3000:]
    runs, client = _trial_runs(project)
    windows = _per_gpu(runs, gpus, client)
    assert len(runs) == 4
    assert max(_most_at_once(w) for w in windows.values()) == 2, windows  # two trials shared a GPU at once
    assert _most_at_once([w for ws in windows.values() for w in ws]) <= 2 * gpus


def test_a_trial_given_a_gpu_without_cuda_fails_in_one_line(project: Project, project_params: dict) -> None:
    """No silent CPU training: the trial fails before its first epoch, is not trained by its retries, and the message
    (one line, naming the option) is in the stage's output and on its run."""
    # One retry shows it is not trained again (each attempt starts a Ray worker: more would only cost time).
    project_params["sweep"].update(variants=["sa_quadratic_9"], max_failures=1)
    returncode, output = _gpu_sweep(project, project_params, 1, [45])
    assert returncode == 1, output[-3000:]
    summary = [line for line in output.splitlines() if "sa_quadratic_9 seed 45 failed, not retried:" in line]
    assert len(summary) == 1 and "sweep.resources.cpu_fallback: true" in summary[0], output[-3000:]
    said = [line for line in output.splitlines() if "Ray assigned this trial GPU [" in line]
    assert said and all("but torch finds no CUDA device" in line for line in said), output[-3000:]
    assert all("sweep.resources.cpu_fallback: true" in line for line in said), output[-3000:]
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    (trial,) = manifest["trials"]
    assert trial["status"] == "error" and trial["epochs_completed"] == 0  # failed before training on the CPU
    reason = MlflowClient(manifest["tracking_uri"]).get_run(trial["run_id"]).data.tags["tune.failure_reason"]
    assert "\n" not in reason and reason.startswith("Ray assigned this trial GPU [")
    assert "sweep.resources.cpu_fallback: true" in reason
