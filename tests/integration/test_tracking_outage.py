"""An MLflow tracking server down for longer than the client's retry budget, on the real tools: a `mlflow server` of the
module's own (killed and restarted on the same port and store; one experiment per test), the session's Ray, the tune
stage as a subprocess.

The first test keeps MLflow's default retry budget (about four minutes on a dead server): the sweep's writes must hand
over to the outage buffer within seconds, epochs arriving as fast as before the outage. The second gives the stage a
budget of one try (MLflow's ``MLFLOW_HTTP_REQUEST_*`` variables) for its other requests; the training must go on,
its writes buffered and replayed."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.tracking.buffer import BUFFER_FILE
from tests.tracebacks import tracebacks

if TYPE_CHECKING:
    from conftest import Project

from tests.integration.conftest import MlflowServer

pytestmark = pytest.mark.slow

EPOCHS = 5
TINY_RETRY_BUDGET = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
# The server stays down in that test: the stage's wait at its end for it to come back (a minute) only delays the exit.
SHORT_FINAL_WAIT_S = 5.0


@pytest.fixture(scope="module")
def outage_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One server of this module's own (the tests kill it), started once: each test tracks into its own experiment."""
    mlflow = MlflowServer(tmp_path_factory.mktemp("outage-server"))
    mlflow.start()
    try:
        yield mlflow
    finally:
        mlflow.kill()


@pytest.fixture
def server(outage_server: MlflowServer) -> MlflowServer:
    """The module's server, answering when the test starts (a test that failed while it was down left it so)."""
    if outage_server.process is None or outage_server.process.poll() is not None:
        outage_server.start()
    return outage_server


def _tune_command(final_wait_s: float | None = None) -> list[str]:
    """``python -m stages.tune``; with ``final_wait_s``, the stage's own code with its wait at the end for a server
    that is down (``FINAL_WAIT_S``: a minute) cut to that: a test that only needs the stage to give up saves the rest.
    """
    if final_wait_s is None:
        return ["python", "-m", "stages.tune"]
    shortened = (
        "import runpy, pipeline.sweep.tracked as tracked\n"
        "assert isinstance(tracked.FINAL_WAIT_S, float), 'the wait this test shortens moved'\n"
        f"tracked.FINAL_WAIT_S = {float(final_wait_s)!r}\n"
        "runpy.run_module('stages.tune', run_name='__main__', alter_sys=True)\n"
    )
    return ["python", "-c", shortened]


def _start_tune(
    project: Project, budget: dict[str, str] = TINY_RETRY_BUDGET, final_wait_s: float | None = None
) -> subprocess.Popen:
    return project.start_tune(tuple(_tune_command(final_wait_s)), env={**project.env, **budget})


def _experiment(seeds: list[int]) -> str:
    """Each test's experiment on the shared server: a kill waits for a first epoch of this test's own runs."""
    return "it-outage-" + "-".join(map(str, seeds))


def _sweep(project: Project, params: dict, server: MlflowServer, seeds: list[int], epochs: int = EPOCHS) -> Path:
    """One variant, ``epochs`` epochs, one trial at a time, tracked by ``server`` into ``_experiment(seeds)``; the Ray
    experiment dir."""
    params["train"]["epochs"] = epochs
    params["sweep"].update(
        variants=["sa_quadratic_9"], seeds=seeds, max_concurrent_trials=1, fail_once_after_epoch=None
    )
    params["tracking"] = {"uri": server.uri, "experiment": _experiment(seeds)}
    project.write_params(params)
    loaded = load_params(project.path / "params.yaml")
    return project.path / "results/ray" / experiment_name(loaded, prepared_data_hash(loaded, project.path))


def _reported(path: Path) -> int:
    """Epochs the driver has received from the trials so far (Tune's ``result.json`` lines, written on its loop)."""
    return sum(len(p.read_text().splitlines()) for p in path.glob("*/result.json"))


@contextmanager
def _arrivals(path: Path) -> Iterator[list[tuple[float, int]]]:
    """``(time, epochs reported)`` sampled every 50 ms on a thread while the block runs."""
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            samples.append((time.monotonic(), _reported(path)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        done.set()
        sampler.join()


def _rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """Epochs per second reported between the first new epoch after ``start`` and the last one by ``end`` (epochs that
    arrive together, between two samples, count as they come); 0 when they all came at once: a stall, then a burst."""
    window = [(t, n) for t, n in samples if start <= t <= end]
    base = window[0][1]
    first, first_n = next((t, n) for t, n in window if n > base)
    last_n = window[-1][1]
    last = next(t for t, n in window if n == last_n)
    return (last_n - first_n) / (last - first) if last > first else 0.0


def _arrived_twice(samples: list[tuple[float, int]]) -> bool:
    """Reported epochs were seen to grow at least twice: a rate can be measured from them."""
    return len({n for _, n in samples if n > 0}) >= 2


def _kill_after_epoch_reported(
    server: MlflowServer,
    stage: subprocess.Popen,
    path: Path,
    experiment: str,
    after: int = 1,
    also: Callable[[], bool] = lambda: True,
) -> int:
    """Kill the server as soon as the driver has received ``after`` epochs (Tune's ``result.json``) and a trial's run is
    in ``experiment`` (the run's first writes made), and ``also()``; the epochs reported by then. Not "epoch k in
    MLflow": epochs this short are held and sent together (``tracking.epochs.SEND_EVERY_S``)."""
    client = MlflowClient(server.uri)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and stage.poll() is None:
        reported = _reported(path)
        found = client.get_experiment_by_name(experiment) if reported >= after else None
        runs = client.search_runs([found.experiment_id], "tags.`mlflow.parentRunId` != ''") if found else []
        if runs and also():
            server.kill()
            return reported
        time.sleep(0.2)
    stage.kill()
    raise AssertionError(f"no epoch reported:\n{stage.communicate()[0][-3000:]}")


def _wait_for(condition, stage: subprocess.Popen, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 240
    while not condition():
        if stage.poll() is not None or time.monotonic() > deadline:
            stage.kill()
            raise AssertionError(f"{what} never happened:\n{stage.communicate()[0][-3000:]}")
        time.sleep(0.2)


def _assert_runs_complete(
    client: MlflowClient, parent_run_id: str, experiment_id: str, trials: int, epochs: int = EPOCHS
) -> list:
    """Every trial's run FINISHED with each epoch once at its step, its checkpoint uploaded; the parent FINISHED."""
    assert client.get_run(parent_run_id).info.status == "FINISHED"
    runs = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}'")
    assert len(runs) == trials
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["tune.status"] == "finished"
        for metric in ("test_acc", "train_loss"):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, metric)]
            assert sorted(steps) == list(range(1, epochs + 1)), (metric, steps)  # none lost, none twice
        uploaded = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")}
        assert "checkpoint/checkpoint.pt" in uploaded and "tune.checkpoint" in run.data.tags
    return runs


def test_an_outage_stalls_no_epoch_and_loses_nothing(
    project: Project, project_params: dict, server: MlflowServer
) -> None:
    """MLflow's default retry budget (minutes). Killed once epoch 4 reached the driver; the trial trains its other
    epochs and ends while the server is down, epochs reaching the driver about as fast as before the outage (the first
    failed write hands over to the buffer in seconds, not after the client's retries); the server comes back before the
    stage gives up: everything buffered is replayed in order, each epoch once, exit 0."""
    epochs = 24  # enough left after epoch 4 that a rate during the outage is measured on a loaded machine too
    project.dvc("repro", "prepare")
    path = _sweep(project, project_params, server, seeds=[11], epochs=epochs)
    stage = _start_tune(project, budget={})
    with _arrivals(path) as samples:
        started = time.monotonic()
        # Both: epoch 4 at the driver with the run made (the outage comes after the run's first writes) and a rate to
        # compare with: on a loaded machine the driver's count was seen to jump 0 -> 2 in one sample, which measures
        # no rate at all.
        reported_before = _kill_after_epoch_reported(
            server, stage, path, _experiment([11]), after=4, also=lambda: _arrived_twice(samples)
        )
        killed = time.monotonic()
        _wait_for(lambda: _reported(path) >= epochs, stage, "the last epoch while down")
        ended = time.monotonic() + 0.1
    before, during = _rate(samples, started, killed), _rate(samples, killed, ended)
    at_kill = max((n for t, n in samples if t <= killed), default=0)
    print(f"epochs/s reaching the driver: {before:.2f} before the outage, {during:.2f} during it")
    # Unloaded here: 1.97 before, 2.52 during; a stalled loop (MLflow's retries) delivers none for minutes. A quarter
    # leaves room for a machine loaded by other jobs (0.93 vs 0.56 seen) without hiding a stall.
    assert during >= 0.25 * before, (before, during, f"{at_kill} of {epochs} epochs reported at the kill")
    server.start()
    output, _ = stage.communicate(timeout=240)
    assert stage.returncode == 0, output[-3000:]
    assert reported_before < epochs  # the outage came while the trial trained
    assert not tracebacks(output), output[-3000:]
    assert "does not answer" in output and "buffered write(s) flushed" in output, output[-3000:]
    assert not (path / BUFFER_FILE).exists()
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    client = MlflowClient(server.uri)
    _assert_runs_complete(client, manifest["parent_run_id"], manifest["experiment_id"], trials=1, epochs=epochs)
    assert manifest["trials"][0]["artifacts"]["checkpoint"].startswith("runs:/")


def test_a_server_that_stays_down_ends_in_one_line_and_the_next_run_flushes(
    project: Project, project_params: dict, server: MlflowServer
) -> None:
    """Two trials one after the other: the server dies during the first, so the second starts (its run is created
    only when the buffer is replayed) and both end while it is down. The stage waits, then ends with one line,
    exit 75, the manifest written; once the server is back, the next run flushes the buffer and trains nothing."""
    project.dvc("repro", "prepare")
    path = _sweep(project, project_params, server, seeds=[12, 13])
    stage = _start_tune(project, final_wait_s=SHORT_FINAL_WAIT_S)
    _kill_after_epoch_reported(server, stage, path, _experiment([12, 13]))
    output, _ = stage.communicate(timeout=300)
    assert stage.returncode == 75, output[-3000:]
    assert not tracebacks(output), output[-3000:]
    last = output.strip().splitlines()[-1]
    assert f"the MLflow server at {server.uri} does not answer" in last and str(path / BUFFER_FILE) in last, last
    assert "the next run of this stage flushes them" in last
    buffered = (path / BUFFER_FILE).read_text().splitlines()
    assert f"{len(buffered)} write(s) are buffered" in last
    assert any(json.loads(line)["op"] == "create_run" for line in buffered)  # the second trial's run
    first = json.loads((project.path / "results/tune/manifest.json").read_text())
    assert [t["status"] for t in first["trials"]] == ["finished", "finished"]
    trained = {p.parent.name: len(p.read_text().splitlines()) for p in path.glob("*/result.json")}
    assert sorted(trained.values()) == [EPOCHS, EPOCHS]

    server.start()
    done = subprocess.run(
        ["python", "-m", "stages.tune"],
        cwd=project.path,
        env={**project.env, **TINY_RETRY_BUDGET},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert f"{len(buffered)} buffered write(s) flushed" in output and not tracebacks(output), output[-3000:]
    assert not (path / BUFFER_FILE).exists()
    assert {p.parent.name: len(p.read_text().splitlines()) for p in path.glob("*/result.json")} == trained
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    assert manifest["parent_run_id"] == first["parent_run_id"]
    client = MlflowClient(server.uri)
    runs = _assert_runs_complete(client, manifest["parent_run_id"], manifest["experiment_id"], trials=2)
    assert sorted(t["run_id"] for t in manifest["trials"]) == sorted(r.info.run_id for r in runs)
