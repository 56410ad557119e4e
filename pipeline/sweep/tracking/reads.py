"""Many runs read in a few requests: runs by id in batches, one metric's history of many runs at once, and named
artifact files fetched without listing their folder.

Why: the analysis reads every run a study names; one ``get_run``, one ``get_metric_history`` per metric and a folder
download per run (a listing, then each file) made it about nine requests per run, a thousand runs a long wait on one
server. Here a run costs a share of one search, a share of one bulk history request per metric, and one request per
artifact file it needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, ViewType
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.rest_utils import augmented_raise_for_status, http_request

SEARCH_IDS = 100  # run ids per search: a filter of 100 ids is about 4 KB, far under what the server parses
# The server's bulk history (MLflow 3.17.2, ``/ajax-api/2.0/mlflow/metrics/get-history-bulk``, what its UI charts
# read): at most 100 runs and 25,000 points per request, the rest cut off silently (100 runs of 250 epochs fit).
BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
BULK_RUNS = 100
BULK_POINTS = 25_000


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def runs_by_id(client: MlflowClient, run_ids: Iterable[str], experiment_ids: Sequence[str]) -> dict[str, Any]:
    """Run id -> run (params, tags, each metric's latest value) for the ids found in ``experiment_ids``, deleted
    runs included (``get_run`` finds them too); ids not found are left out (the caller asks for them one by one)."""
    ids, experiments = sorted(set(run_ids)), [e for e in experiment_ids if e]
    found: dict[str, Any] = {}
    for chunk in _chunks(ids, SEARCH_IDS) if experiments else ():
        query = "attributes.run_id IN ({})".format(", ".join(f"'{run_id}'" for run_id in chunk))
        try:
            runs = client.search_runs(experiments, query, run_view_type=ViewType.ALL, max_results=len(chunk))
        except MlflowException:  # an experiment the store does not have (a manifest from another store)
            return found
        found |= {run.info.run_id: run for run in runs}
    return found


def metric_histories(client: MlflowClient, uri: str, key: str, run_ids: Sequence[str]) -> dict[str, list[Metric]]:
    """Run id -> every logged point of metric ``key``, for ``run_ids``. An http server answers a hundred runs per
    request (a batch whose points reach the server's cap is split in two and asked again); any other store, run by
    run (it is in this process: no request to save)."""
    if not uri.startswith(("http://", "https://")):
        return {run_id: client.get_metric_history(run_id, key) for run_id in run_ids}
    histories: dict[str, list[Metric]] = {run_id: [] for run_id in run_ids}
    batches = [list(chunk) for chunk in _chunks(list(run_ids), BULK_RUNS)]
    while batches:
        batch = batches.pop()
        params = [("run_id", run_id) for run_id in batch] + [("metric_key", key), ("max_results", BULK_POINTS)]
        response = http_request(get_default_host_creds(uri), BULK_ENDPOINT, "GET", params=params)
        augmented_raise_for_status(response)
        metrics = response.json().get("metrics", [])
        if len(metrics) >= BULK_POINTS:  # cut off: ask again in halves (one run alone: its own history, paged)
            if len(batch) == 1:
                histories[batch[0]] = client.get_metric_history(batch[0], key)
            else:
                batches += [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
            continue
        for m in metrics:
            histories[m["run_id"]].append(Metric(m["key"], m["value"], m["timestamp"], m["step"]))
    return histories


def is_absent(err: Exception) -> bool:
    """Whether a failed artifact download means the file is not there (404, no such key), not a store fault."""
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    if status is None and isinstance(response, dict):  # botocore's ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    missing = isinstance(err, MlflowException) and err.error_code == "RESOURCE_DOES_NOT_EXIST"  # a local folder's
    return status == 404 or missing or isinstance(err, FileNotFoundError)


def download_files(uri: str, artifact_uri: str, folder: str, names: Sequence[str], destination: Path) -> list[str]:
    """The files ``names`` of a run's artifact ``folder`` (``artifact_uri``: the run's artifact root) fetched into
    ``destination``, one request each and no listing; returns the names that were there (a file that is not is left
    out; any other failure raises)."""
    repository = get_artifact_repository(artifact_uri, tracking_uri=uri)
    destination.mkdir(parents=True, exist_ok=True)
    fetched = []
    for name in names:
        try:
            # MLflow 3.17.2's one-file download: its public ``download_artifacts`` lists the path first to tell a
            # folder from a file, a request per file that this caller, which names files, does not need.
            repository._download_file(f"{folder}/{name}", str(destination / name))
        except Exception as err:  # the repository's own: requests' HTTPError, botocore's ClientError, OSError
            (destination / name).unlink(missing_ok=True)
            if not is_absent(err):
                raise
            continue
        fetched.append(name)
    return fetched
