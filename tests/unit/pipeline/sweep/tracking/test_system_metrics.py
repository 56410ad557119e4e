"""System metrics sampled in the trial's worker: where it may write, what hardware it records (in one request), that
MLflow can sample a GPU, and that a store that does not answer never holds a trial's end.

The monitor itself on a real Ray worker and MLflow store: tests/integration/test_tune_pipeline.py (test_run_tree).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from pipeline.sweep.tracking import system_metrics
from pipeline.sweep.tracking.system_metrics import MetricsTarget, TrialSystemMetrics, hardware_tags, reachable_here


def test_a_worker_writes_only_to_a_store_it_has(tmp_path: Path) -> None:
    database = tmp_path / "mlflow.db"
    assert not reachable_here(f"sqlite:///{database}")  # opening it would create an empty store on this node
    database.write_bytes(b"")
    assert reachable_here(f"sqlite:///{database}")
    assert reachable_here("http://127.0.0.1:5000")


def test_the_hardware_is_named() -> None:
    tags = hardware_tags()
    assert tags["host.cpu"] and int(tags["host.cpu_count"]) >= 1 and float(tags["host.memory_gb"]) > 0
    assert tags["torch.version"] == torch.__version__ and tags["torch.cuda"] == str(torch.version.cuda)
    assert ("host.gpu" in tags) == torch.cuda.is_available()


def test_mlflow_can_sample_a_gpu() -> None:
    """MLflow's GPU monitor needs ``pynvml`` (nvidia-ml-py, in the lock): without a GPU it now fails only where NVML
    finds no driver, not for want of the package; with one it samples the GPU's utilisation and memory."""
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="Failed to initialize NVML"):
            GPUMonitor()
        return
    monitor = GPUMonitor()
    monitor.collect_metrics()
    sampled = monitor.aggregate_metrics()
    assert {"gpu_0_utilization_percentage", "gpu_0_memory_usage_megabytes"} <= sampled.keys(), sampled


@pytest.fixture
def stalled_server() -> Iterator[tuple[str, threading.Event]]:
    """An http address that accepts connections and never answers (a hung server, or a network that drops the
    replies): the MLflow client waits for its timeout on each of its retries. Yields the address and an event set
    once a request arrived."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    requested, closing, held = threading.Event(), threading.Event(), []

    def accept() -> None:
        while not closing.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            held.append(connection)
            requested.set()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", requested
    finally:
        closing.set()
        acceptor.join()
        for connection in held:
            connection.close()
        listener.close()


def test_a_store_that_does_not_answer_never_holds_the_trials_end(
    stalled_server: tuple[str, threading.Event], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    uri, requested = stalled_server
    # What train_with_system_metrics sets in the worker: each request waits 10 s, three times.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    monkeypatch.setattr(system_metrics, "STOP_S", 1.0)
    monitor = TrialSystemMetrics(MetricsTarget(uri, "1"), "trial_0001")
    monitor.start()
    assert requested.wait(30), "the worker never asked the store for its run"
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=system_metrics.__name__):
        monitor.stop()  # the trial's end
    assert time.monotonic() - started < 2.5
    assert f"the store at {uri} did not take them within 1 s" in caplog.text


def test_the_trials_run_gets_its_hardware_in_one_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from pipeline.sweep.tracking.tags import TRIAL_ID_TAG

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("study", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment, tags={TRIAL_ID_TAG: "trial_0001"})  # what the driver's callback opens
    writes: list[str] = []

    def counting(name: str) -> Callable[..., object]:
        original = getattr(MlflowClient, name)

        def counted(self: MlflowClient, *args: object, **kwargs: object) -> object:
            writes.append(name)
            return original(self, *args, **kwargs)

        return counted

    for name in ("set_tag", "log_batch"):
        monkeypatch.setattr(MlflowClient, name, counting(name))
    monitor = TrialSystemMetrics(MetricsTarget(uri, experiment), "trial_0001")
    monitor.start()
    deadline = time.monotonic() + 60
    while "host.cpu" not in client.get_run(run.info.run_id).data.tags and time.monotonic() < deadline:
        time.sleep(0.2)
    monitor.stop()
    tags = client.get_run(run.info.run_id).data.tags
    assert tags.items() >= hardware_tags().items()
    assert writes.count("set_tag") == 0 and writes.count("log_batch") >= 1  # the tags in one batch; then the samples
