"""One MLflow store as the rest of the project sees it: every read, and every write outside a trial's run.

The driver, the submit path, the UI stage and the analysis call a ``Store`` and never a raw ``MlflowClient`` (a test
walks their code for such calls), so the client factory (``store.mlflow_client``), the one ``/health`` probe
(``store.health``) and the short retry budget have one place each. The analysis run is written through a
``TrackingBuffer`` with the short budget, as the tune stage's runs are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlflow.artifacts
from mlflow.exceptions import MlflowException

from pipeline.sweep.manifest import TrialRecord
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.buffer import PLACEHOLDER, TrackingBuffer
from pipeline.sweep.tracking.logged_model import download_checkpoint
from pipeline.sweep.tracking.parent import parent_finished
from pipeline.sweep.tracking.reads import download_files, metric_histories, runs_by_id
from pipeline.sweep.tracking.registry import SweepSummary, publish_summary, register_best_models
from pipeline.sweep.tracking.store import (
    active_experiment_id,
    check_runs_exist,
    experiment_name,
    find_runs,
    finished_run,
    health,
    mlflow_client,
    server_answers,
)
from pipeline.sweep.tracking.system_metrics import reachable_here
from pipeline.sweep.tracking.ui import save_shared_view

TrackingError = MlflowException  # what a request the store refused (or could not answer) raises
HEALTH_TIMEOUT_S = 5.0  # a check before work: longer than the buffer's probe, far shorter than the client's retries


class Store:
    """The MLflow store at ``uri``: its client is built once, lazily, by ``store.mlflow_client``."""

    def __init__(self, uri: str, client: Any = None) -> None:
        self.uri = uri
        self._client = client  # given: a counting one (a benchmark, a test of the requests a plan costs)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = mlflow_client(self.uri)
        return self._client

    def answers(self) -> bool:
        """A short ``/health`` probe (a local store has no server to be down)."""
        return server_answers(self.uri)

    def reachable(self) -> bool:
        """Whether this machine can reach the store's address (a worker's loopback server is not)."""
        return reachable_here(self.uri)

    def check_answers(self, source: str) -> None:
        """Refuse, naming ``source`` (a params key, a manifest), an http server that does not answer now: MLflow's
        client would retry for minutes and fail late."""
        if (problem := health(self.uri, HEALTH_TIMEOUT_S)) is not None:
            raise ValueError(
                f"{source}: no MLflow server answers at {self.uri}/health ({problem}); start one or fix the URI"
            )

    # reads
    def run(self, run_id: str) -> Any:
        return self.client.get_run(run_id)

    def metric_history(self, run_id: str, key: str) -> list[Any]:
        return self.client.get_metric_history(run_id, key)

    def runs(self, run_ids: list[str], experiment_ids: list[str]) -> dict[str, Any]:
        """Run id -> run for the ids found in ``experiment_ids``, about a request per hundred runs (the others: ask
        ``run`` one by one)."""
        return runs_by_id(self.client, run_ids, experiment_ids)

    def metric_histories(self, key: str, run_ids: list[str]) -> dict[str, list[Any]]:
        """Run id -> every point of metric ``key`` of ``run_ids``, a request per hundred runs."""
        return metric_histories(self.client, self.uri, key, run_ids)

    def download_files(self, artifact_uri: str, folder: str, names: list[str], destination: Path) -> list[str]:
        """Files ``names`` of a run's artifact ``folder`` into ``destination``, a request each; those found."""
        return download_files(self.uri, artifact_uri, folder, names, destination)

    def artifact_names(self, run_id: str, folder: str) -> list[str]:
        """The file names in a run's artifact ``folder``."""
        return [item.path.rsplit("/", 1)[-1] for item in self.client.list_artifacts(run_id, folder)]

    def download(self, run_id: str, path: str, destination: Path) -> Path:
        """A run's artifact file or folder ``path`` downloaded into ``destination``; the local path."""
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=path, dst_path=str(destination), tracking_uri=self.uri
        )
        return Path(local)

    def download_checkpoint(self, artifact_uri: str, destination: Path) -> str:
        return download_checkpoint(self.uri, artifact_uri, destination)

    def experiment_id(self, name: str) -> str | None:
        return active_experiment_id(self.uri, name)

    def experiment_name(self, experiment_id: str) -> str:
        return experiment_name(self.uri, experiment_id)

    def parent_finished(self, experiment_dir: StoragePath) -> bool:
        """Whether the parent run recorded in a Ray experiment folder ended FINISHED here."""
        return parent_finished(experiment_dir, self.uri)

    def find_runs(self, experiment_id: str, keys: Iterable[str]) -> dict[str, list[Any]]:
        return find_runs(self.client, experiment_id, keys)

    def finished_run(self, run_id: str, step0_metric: str | None = None) -> tuple[Any, float | None]:
        return finished_run(self.uri, run_id, step0_metric)

    def check_runs_exist(self, run_ids: list[str | None], manifest: Path) -> None:
        check_runs_exist(self.uri, run_ids, manifest)

    def search(self, experiment_id: str, query: str, max_results: int = 100) -> list[Any]:
        return list(self.client.search_runs([experiment_id], query, max_results=max_results))

    def tagged_run(self, experiment: str, tag: str, value: str) -> str | None:
        """The id of a run of experiment ``experiment`` (by name) tagged ``tag`` = ``value``; None when none is."""
        found = self.client.get_experiment_by_name(experiment)
        runs = self.search(found.experiment_id, f"tags.`{tag}` = '{value}'") if found else []
        return runs[0].info.run_id if runs else None

    # writes outside a trial's run
    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def publish_files(self, run_id: str, files: list[Path], folder: str, tags: dict[str, str]) -> None:
        """``files`` as artifacts of ``run_id`` under ``folder``, then ``tags`` (which say they are there)."""
        for path in files:
            self.client.log_artifact(run_id, str(path), artifact_path=folder)
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)

    def share_view(self, experiment_id: str, run_ids: list[str], parent_run_id: str | None) -> str:
        return save_shared_view(self.client, experiment_id, run_ids, parent_run_id)

    def register_best_models(self, experiment: str, trials: list[TrialRecord], suffix: str = "") -> dict[str, str]:
        return register_best_models(self.uri, experiment, trials, suffix=suffix)

    def publish_summary(self, parent_run_id: str, summary: SweepSummary, trials: list[TrialRecord]) -> None:
        publish_summary(self.uri, parent_run_id, summary, trials)

    def write_run(
        self,
        experiment_id: str,
        run_id: str | None,
        run_name: str,
        tags: dict[str, str],
        files: dict[str, list[Path]],
        tables: dict[str, Any],
        metrics: dict[str, float],
    ) -> str:
        """One whole run outside a sweep (the analysis run), written in order through a ``TrackingBuffer`` with the
        short retry budget, as a trial's run is: ``run_id`` reopened, or a new run ``run_name``; ``tags`` set;
        ``files`` (artifact folder -> local files) and ``tables`` (artifact file -> frame, a table in the UI)
        logged; the finite ``metrics`` logged; the run finished. Its id. A server that stops answering fails the
        first write within the budget, not after MLflow's minutes of retries."""
        buffer = TrackingBuffer(None, self.uri)
        if run_id is None:
            run_id = buffer.create_run(f"{PLACEHOLDER}{run_name}", experiment_id, run_name, tags)
        else:
            buffer.update_run(run_id, "RUNNING")
        buffer.set_tags(run_id, tags)
        for folder, paths in files.items():
            for path in paths:
                buffer.log_artifact(run_id, path, folder)
        for artifact_file, frame in tables.items():
            buffer.log_table(run_id, frame, artifact_file)
        buffer.log_metrics(run_id, {key: value for key, value in metrics.items() if math.isfinite(value)})
        buffer.set_terminated(run_id, "FINISHED")
        return run_id

    def delete_run(self, run_id: str) -> None:
        self.client.delete_run(run_id)
