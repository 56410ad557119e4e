"""System metrics of every trial's run (CPU, memory, disk, network; GPU with ``nvidia-ml-py``), sampled in the trial.

MLflow samples system metrics only in the process it runs in, and a Ray worker's CPU and GPU are not the driver's: the
sweep's trainable is wrapped (``train_with_system_metrics``) to run MLflow's ``SystemMetricsMonitor`` in the worker, on
the run the driver's callback opened for the trial (found by its ``ray.trial_id`` tag), with the hardware as tags
(``host.*``, ``torch.*``). Best effort, outside the outage buffer: a store the worker cannot reach costs a warning,
never the trial, whose end waits at most ``STOP_S`` for these writes. The trial code is unchanged (its identity
hashes it); ``tracking.uri`` must be reachable from the nodes, as for the checkpoints.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SAMPLING_S = 10.0  # MLflow's default interval; MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it
SAMPLES_PER_LOG = 3  # averaged into one write every 30 s (MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING overrides)
FIND_RUN_S = 120.0  # how long the worker looks for its run before giving up
POLL_S = 2.0
STOP_S = 10.0  # the most a trial's end waits for its last system metrics to be written (a store down or stalled)


@dataclass(frozen=True)
class MetricsTarget:
    """Where a trial's system metrics go: the store and the experiment of the sweep's runs."""

    tracking_uri: str
    experiment_id: str


def hardware_tags() -> dict[str, str]:
    """The machine a trial ran on: CPU model and count, memory, torch and CUDA versions, the GPU's name."""
    import psutil
    import torch

    tags = {
        "host.cpu": _cpu_model(),
        "host.cpu_count": str(os.cpu_count()),
        "host.memory_gb": f"{psutil.virtual_memory().total / 2**30:.1f}",
        "host.platform": platform.platform(),
        "torch.version": torch.__version__,
        "torch.cuda": str(torch.version.cuda),
    }
    if torch.cuda.is_available():
        tags["host.gpu"] = torch.cuda.get_device_name(0)
        tags["host.gpu_count"] = str(torch.cuda.device_count())
    return tags


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class TrialSystemMetrics:
    """MLflow's ``SystemMetricsMonitor`` on the run of the current Tune trial, started from a background thread that
    first waits for the driver to open that run."""

    def __init__(self, target: MetricsTarget, trial_id: str) -> None:
        self.target, self.trial_id = target, trial_id
        self._stop = threading.Event()
        self._monitor: Any = None
        self._thread = threading.Thread(target=self._start, name="trial-system-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def find_run(self) -> str | None:
        """The RUNNING run tagged with this trial's id, waiting up to ``FIND_RUN_S`` for the driver to create it."""
        from mlflow.tracking import MlflowClient

        from pipeline.sweep.tracking.tags import TRIAL_ID_TAG

        client = MlflowClient(self.target.tracking_uri)
        query = f"tags.`{TRIAL_ID_TAG}` = '{self.trial_id}' and attributes.status = 'RUNNING'"
        waited = 0.0
        while not self._stop.is_set() and waited <= FIND_RUN_S:
            runs = client.search_runs([self.target.experiment_id], query, max_results=1)
            if runs:
                return runs[0].info.run_id
            self._stop.wait(POLL_S)
            waited += POLL_S
        return None

    def _start(self) -> None:
        try:
            from mlflow.entities import RunTag
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
            from mlflow.tracking import MlflowClient

            run_id = self.find_run()
            if run_id is None:
                if not self._stop.is_set():
                    log.warning("system metrics: no run of trial %s in %s", self.trial_id, self.target.tracking_uri)
                return
            tags = [RunTag(key, value) for key, value in hardware_tags().items()]
            MlflowClient(self.target.tracking_uri).log_batch(run_id, tags=tags)  # one request, not one per tag
            if self._stop.is_set():
                return
            self._monitor = SystemMetricsMonitor(
                run_id,
                sampling_interval=SAMPLING_S,
                samples_before_logging=SAMPLES_PER_LOG,
                resume_logging=True,  # a retried or restored trial continues the run's system/ steps
                node_id=None,
                tracking_uri=self.target.tracking_uri,
            )
            self._monitor.start()
        except Exception as err:  # noqa: BLE001 - system metrics never stop a trial
            log.warning("system metrics of trial %s not logged: %s", self.trial_id, err)

    def stop(self) -> None:
        """End the sampling and log the last window, waiting at most ``STOP_S`` (the rest in the background): a server
        down or stalled never holds the trial's end."""
        self._stop.set()
        finishing = threading.Thread(target=self._finish, name="trial-system-metrics-stop", daemon=True)
        finishing.start()
        finishing.join(timeout=STOP_S)
        if finishing.is_alive():
            log.warning(
                "system metrics of trial %s: the store at %s did not take them within %g s; left to finish in the "
                "background",
                self.trial_id,
                self.target.tracking_uri,
                STOP_S,
            )

    def _finish(self) -> None:
        if self._thread.ident is not None:  # started: finding the run, starting the monitor; sees the stop next step
            self._thread.join()
        if self._monitor is None:
            return
        try:
            self._monitor.finish()
            # MLflow's loop drops the samples of an unfinished logging window: log them, so a trial shorter than
            # one window still has its point (averaged over what was sampled).
            if leftover := self._monitor.aggregate_metrics():
                self._monitor.publish_metrics(leftover)
                self._monitor.mlflow_logger.flush()
        except Exception as err:  # noqa: BLE001
            log.warning("system metrics of trial %s: %s", self.trial_id, err)


def reachable_here(uri: str) -> bool:
    """Whether this node can write to the store: a sqlite file must exist here (opening a missing one would create a
    new, empty store on a node that does not have the project's)."""
    if uri.startswith("sqlite:///"):
        return os.path.isfile(uri.removeprefix("sqlite:///"))
    return True


def train_with_system_metrics(
    config: dict[str, Any],
    *,
    system_metrics: MetricsTarget | None,
    train: Callable[..., None] | None = None,
    **kwargs: Any,
) -> None:
    """``train`` (``pipeline.trial.trainable.train_trial``) with its run's system metrics sampled meanwhile (in the
    worker)."""
    from ray import tune

    from pipeline.trial.trainable import train_trial

    monitor = None
    if system_metrics is not None and reachable_here(system_metrics.tracking_uri):
        # This worker talks to MLflow for this only: a server that is down costs seconds, not the client's minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop lines per trial
        monitor = TrialSystemMetrics(system_metrics, tune.get_context().get_trial_id())
        monitor.start()
    try:
        (train or train_trial)(config, **kwargs)
    finally:
        if monitor is not None:
            monitor.stop()
