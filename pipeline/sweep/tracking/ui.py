"""The MLflow UI address of a sweep: its trials' runs in the model-training view, best ``test_acc`` first.

MLflow 3.17's UI reads the runs table's state from the URL's query (``searchFilter``, ``orderByKey``, ``orderByAsc``)
and which of its two modes to show from ``workflowType`` (``machine_learning``; ``genai`` opens traces and
evaluations). The filter names the sweep's runs by id: a sweep that reused finished runs lists runs whose parent is an
earlier sweep, which a filter on the parent would miss. Sorting puts the ``test_acc`` column in the table.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

SORT_METRIC = "test_acc"
MAX_FILTERED_RUNS = 100  # beyond this many ids the URL gets unwieldy: filter on the sweep's parent instead


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
        "orderByKey": f"metrics.`{SORT_METRIC}`",
        "orderByAsc": "false",
        "workflowType": "machine_learning",
    }
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"


def experiments_url(base: str) -> str:
    """The experiments list in the model-training view (no sweep yet)."""
    return f"{base.rstrip('/')}/#/experiments?workflowType=machine_learning"
