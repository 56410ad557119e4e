"""The MLflow store: every client built in one place, a fresh store created once, and the look-ups the driver makes.

``mlflow_client(uri)`` is the only place the driver builds an ``MlflowClient``, so what every request shares (the
sweep's short retry budget, ``ShortBudgetRestStore``; the benchmark's request counts) has one place. The searches the
driver makes before and after a run (runs by trial identity, a parent's children) are here too, so the requests a
plan costs are counted in one module. ``is_outage`` tells a server that cannot be reached from a request it refused.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import requests
from filelock import FileLock
from mlflow.entities import Run
from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT
from mlflow.exceptions import MlflowException
from mlflow.store.tracking.rest_store import RestStore
from mlflow.tracking import MlflowClient
from mlflow.tracking._tracking_service.client import TrackingServiceClient
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.proto_json_utils import parse_dict
from mlflow.utils.rest_utils import http_request, verify_rest_response

from pipeline.config import TrackingConfig
from pipeline.io import error_chain
from pipeline.sweep.location import ARTIFACTS_DIR, adopt_artifact_root, default_store_uri
from pipeline.sweep.tracking.tags import KEY_TAG, PARENT_TAG, TRIAL_ID_TAG

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
# MLflow 3's UI opens an experiment without this tag in GenAI mode ("Evaluations", "Agent versions", traces first);
# ``custom_model_development`` opens it as a classic model-training experiment: runs table, models, charts.
KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
PLAN_PAGE = 50_000  # runs per search request when planning: MLflow's largest page (SEARCH_MAX_RESULTS_THRESHOLD)
# ChunkedEncodingError: the server died while it sent its reply ("Connection broken: IncompleteRead"); the write may
# have landed, which the outage buffer's replay allows for (it skips the epochs a run already has).
OUTAGE_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.RetryError,
    requests.exceptions.ChunkedEncodingError,
)


# Per request of the sweep's writes to an http server: one retry after 0.5 s, 10 s to connect or answer. A dead server
# (refused) fails in about a second, a hung one in 20 s; MLflow's defaults take about four minutes for either.
WRITE_BUDGET: dict[str, float] = {"max_retries": 1, "backoff_factor": 0.5, "timeout": 10}


def mlflow_client(uri: str, *, short_budget: bool = False) -> MlflowClient:
    """The driver's MLflow client for the store at ``uri``; ``short_budget``: an http server's requests get
    ``WRITE_BUDGET`` (the sweep's writes, which an outage must not stall) instead of MLflow's minutes of retries."""
    client = MlflowClient(uri)
    if short_budget and uri.startswith(("http://", "https://")):
        # Ending a run on a server, MLflow reads it back to print two "View run" lines: a request and two lines of the
        # sweep's log per trial (the stage prints the sweep's UI address once). A value the user set wins.
        os.environ.setdefault(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name, "true")
        client._tracking_client = _TrackingClientOf(uri, ShortBudgetRestStore(partial(get_default_host_creds, uri)))
    return client


class ShortBudgetRestStore(RestStore):
    """MLflow's REST store with ``WRITE_BUDGET`` per request: ``RestStore._call_endpoint`` as MLflow 3 has it, its
    ``http_request`` given the budget that MLflow otherwise takes only from process-wide variables (about four minutes
    on a dead server, during which a write would hold Tune's event loop)."""

    def _call_endpoint(
        self,
        api: Any,
        json_body: str | None = None,
        endpoint: str | None = None,
        retry_timeout_seconds: float | None = None,
        response_proto: Any = None,
    ) -> Any:
        method_to_info = self._V3_METHOD_TO_INFO if api in self._V3_APIS else self._METHOD_TO_INFO
        self._validate_workspace_support_if_specified()
        path, method = method_to_info[api]
        endpoint = endpoint or path
        body = json.loads(json_body) if json_body is not None else None
        payload = {"params": body} if method == "GET" else {"json": body}
        response = http_request(self.get_host_creds(), endpoint, method, **WRITE_BUDGET, **payload)
        response = verify_rest_response(response, endpoint)
        message = response_proto or api.Response()
        if response.status_code != 204:
            parse_dict(js_dict=json.loads(response.text), message=message)
        return message


class _TrackingClientOf(TrackingServiceClient):
    """MLflow's tracking client on a given store (its own resolves one from the URI on every call)."""

    def __init__(self, uri: str, store: RestStore) -> None:
        self._store = store
        super().__init__(uri)

    @property
    def store(self) -> RestStore:
        return self._store


class CountingClient:
    """An ``MlflowClient`` that counts the requests made through it, so the logging cost per epoch is measured."""

    def __init__(self, client: MlflowClient) -> None:
        self._client = client
        self.calls: Counter = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return counted

    def count(self, name: str) -> None:
        """A request made around the client (an upload straight to the run's artifact repository) counted as the
        client's ``name``."""
        self.calls[name] += 1


def tracking_uri(cfg: TrackingConfig, project_root: Path) -> str:
    """``tracking.uri`` or an sqlite store at an absolute ``<project>/mlflow.db`` (never ``./mlruns``)."""
    return cfg.uri or default_store_uri(project_root)


def prepare_store(uri: str, artifacts: Path | None = None) -> None:
    """Create (migrate) a local sqlite store in one process at a time: two processes migrating a fresh database at once
    crash. The second waits on an OS lock beside the database, then finds the schema complete. ``artifacts``: the
    default store's artifact folder, which a copied project's locations are pointed at (``adopt_artifact_root``)."""
    if not uri.startswith("sqlite:///"):
        return
    database = Path(uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{database}.lock", fallback_to_soft=False):
        mlflow_client(uri).search_experiments(max_results=1)  # the first use creates and migrates the schema
        if artifacts is not None:
            adopt_artifact_root(database, artifacts)


def artifact_root(uri: str, project_root: Path) -> str | None:
    """Artifact location for a new experiment: ``<project>/mlartifacts`` next to a local sqlite store (MLflow would
    use ``<cwd>/mlruns``); a server decides for itself."""
    return (project_root / ARTIFACTS_DIR).resolve().as_uri() if uri.startswith("sqlite:") else None


def ensure_experiment(
    client: MlflowClient, name: str, location: str | None, *, created_after: str | None = None
) -> str:
    """The experiment's id, created once here in the driver as a model-training experiment (``EXPERIMENT_KIND``).
    ``created_after``: an experiment to create first when ``name`` is new: MLflow's home page lists the last created
    experiment first, so the study's experiment, not its internal claims, is what a user sees first."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        if created_after is not None:
            ensure_experiment(client, created_after, None)
        try:
            return client.create_experiment(name, artifact_location=location, tags={KIND_TAG: EXPERIMENT_KIND})
        except MlflowException:  # created by someone else meanwhile
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    if KIND_TAG not in experiment.tags:  # a kind the user chose in the UI is kept
        client.set_experiment_tag(experiment.experiment_id, KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id


def active_experiment_id(uri: str, name: str) -> str | None:
    """The id of the active experiment ``name``, None when there is none (a look-up: nothing is created); a store
    that cannot be read raises ``ValueError`` naming it."""
    try:
        experiment = mlflow_client(uri).get_experiment_by_name(name)
    except MlflowException as err:
        raise ValueError(f"the MLflow store at {uri} cannot be read: {err}") from err
    return experiment.experiment_id if experiment and experiment.lifecycle_stage == "active" else None


def experiment_name(uri: str, experiment_id: str) -> str:
    """The name of the MLflow experiment ``experiment_id`` (the registry names models after it)."""
    return mlflow_client(uri).get_experiment(experiment_id).name


def finished_run(uri: str, run_id: str, step0_metric: str | None = None) -> tuple[Run, float | None]:
    """A finished run read back for a stage's manifest, with ``step0_metric``'s value at step 0 (what a fine-tuning
    run measured before training; None when not asked for or not logged)."""
    client = mlflow_client(uri)
    run = client.get_run(run_id)
    if step0_metric is None:
        return run, None
    return run, next((m.value for m in client.get_metric_history(run_id, step0_metric) if m.step == 0), None)


def check_runs_exist(uri: str, run_ids: list[str | None], manifest: Path) -> None:
    """Every run a manifest names must still be in the tracking store (runs deleted or a different store: refuse)."""
    client = mlflow_client(uri)
    for run_id in run_ids:
        try:
            deleted = client.get_run(str(run_id)).info.lifecycle_stage == "deleted"
        except MlflowException:
            deleted = True
        if deleted:
            raise ValueError(f"{manifest}: run {run_id} is not in the MLflow store at {uri} (deleted?)")


def all_runs(client: MlflowClient, experiment_id: str, query: str, page: int = 1000, **order: Any) -> Iterable[Run]:
    """Every run of the experiment matching ``query``, ``page`` runs per request (MLflow pages its searches)."""
    token = None
    while True:
        found = client.search_runs([experiment_id], query, max_results=page, page_token=token, **order)
        yield from found
        token = found.token
        if not token:
            return


def find_runs(client: MlflowClient, experiment_id: str, keys: Iterable[str]) -> dict[str, list[Run]]:
    """The active runs of the experiment tagged with each trial key, newest first. One paged search for every key at
    once (MLflow's filter has no ``IN`` for tags): one request per ``PLAN_PAGE`` keyed runs, not one per trial."""
    found: dict[str, list[Run]] = {key: [] for key in sorted(set(keys))}
    if found:
        query = f"tags.`{KEY_TAG}` LIKE '%'"
        for run in all_runs(client, experiment_id, query, PLAN_PAGE, order_by=["start_time DESC"]):
            if (key := run.data.tags.get(KEY_TAG)) in found:
                found[key].append(run)
    return found


def child_runs(uri: str, experiment_id: str, parent_run_id: str) -> dict[str, Run]:
    """The child runs of ``parent_run_id`` keyed by their Ray trial id (their run id when they have none)."""
    runs = all_runs(mlflow_client(uri), experiment_id, f"tags.`{PARENT_TAG}` = '{parent_run_id}'")
    return {run.data.tags.get(TRIAL_ID_TAG, run.info.run_id): run for run in runs}


def is_outage(err: BaseException) -> bool:
    """Whether ``err`` says the server could not be reached, as opposed to a request it refused. MLflow wraps the
    ``requests`` error in an ``MlflowException`` raised inside its ``except`` block: the cause is the context."""
    return any(isinstance(cause, OUTAGE_ERRORS) for cause in error_chain(err))


def health(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The project's one probe of an http tracking server's ``/health`` (never the client's minutes of retries): None
    when it answers, else what went wrong. A local store (sqlite, a database) has no server to be down."""
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        status = requests.get(f"{uri.rstrip('/')}/health", timeout=timeout_s).status_code
    except (requests.exceptions.RequestException, ValueError) as err:  # refused, timeout, DNS, a bad URL
        return str(err)
    return None if status == 200 else f"HTTP {status}"


def server_answers(uri: str) -> bool:
    return health(uri) is None
