"""The MLflow UI address of a sweep: its trials' runs in the model-training view, best ``test_acc`` first.

MLflow 3.17's UI reads the runs table's filter and sort from the URL's query and its mode from ``workflowType``
(``machine_learning``, not ``genai``). The filter names the sweep's runs by id (reused runs have an earlier sweep as
parent). The columns are not in the URL, but a *shared view* holds them: the UI's Share button stores it as the
experiment tag ``mlflow.sharedViewState.<key>`` opened by ``?viewStateShareKey=<key>`` (checked in MLflow 3.17.2's UI
code and in headless Chromium); ``save_shared_view`` writes it, so the sweep opens with its ``test_acc`` column.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

SORT_METRIC = "test_acc"
SORT_KEY = f"metrics.`{SORT_METRIC}`"
MAX_FILTERED_RUNS = 100  # beyond this many ids the URL gets unwieldy: filter on the sweep's parent instead
SHARED_VIEW_TAG = "mlflow.sharedViewState."  # + the key: the experiment tag the UI's Share button writes
DEFAULT_COLUMNS = ("attributes.`Source`", "attributes.`Models`", "attributes.`Dataset`")  # the UI's own defaults


def runs_filter(run_ids: list[str], parent_run_id: str | None = None) -> str:
    """MLflow's search filter for the sweep's trial runs (by id), or its parent's children when there are too many."""
    if run_ids and len(run_ids) <= MAX_FILTERED_RUNS:
        return "attributes.run_id IN ({})".format(", ".join(f"'{run_id}'" for run_id in run_ids))
    if parent_run_id is None:
        return ""
    return f"tags.`mlflow.parentRunId` = '{parent_run_id}'"


def runs_url(base: str, experiment_id: str, run_ids: list[str], parent_run_id: str | None = None) -> str:
    """The UI page of the experiment's runs table, filtered to ``run_ids`` and sorted by ``test_acc``, best first."""
    query = {
        "searchFilter": runs_filter(run_ids, parent_run_id),
        "orderByKey": SORT_KEY,
        "orderByAsc": "false",
        "workflowType": "machine_learning",
    }
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"


def experiments_url(base: str) -> str:
    """The experiments list in the model-training view (no sweep yet)."""
    return f"{base.rstrip('/')}/#/experiments?workflowType=machine_learning"


def save_shared_view(client: MlflowClient, experiment_id: str, run_ids: list[str], parent_run_id: str | None) -> str:
    """Store the sweep's view (its trials, best ``test_acc`` first, with the ``test_acc`` column) as the UI's shared
    view of the experiment; its key. The key is the view's hash: the same sweep writes the same tag again."""
    state = {
        "searchFilter": runs_filter(run_ids, parent_run_id),
        "orderByKey": SORT_KEY,
        "orderByAsc": False,
        "selectedColumns": [*DEFAULT_COLUMNS, SORT_KEY],
    }
    value = json.dumps(state, sort_keys=True)
    key = "sweep-" + hashlib.sha256(value.encode()).hexdigest()[:12]
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + key, value)
    return key


def shared_view_url(base: str, experiment_id: str, key: str) -> str:
    """The UI page that opens the shared view ``key`` in model-training mode (the view holds filter and sort: the
    UI ignores a shared view when the URL has its own)."""
    query = {"viewStateShareKey": key, "workflowType": "machine_learning"}
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"
