"""The parent run of a sweep (``tune-<hash>``) or a prune run (``prune-<hash>``): opened once, found again on restore.

The driver creates the experiment and the parent run before any trial starts (a cold sqlite store and concurrent
``set_experiment`` calls lose runs). The parent's id is kept in the Ray experiment folder (``PARENT_FILE``), with the
store named independently of where the project lies (``store_key``), so a restored, moved or copied run continues it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import Param
from mlflow.exceptions import MlflowException

from pipeline.sweep.location import ARTIFACTS_DIR
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.claims import CLAIMS_SUFFIX
from pipeline.sweep.tracking.store import artifact_root, ensure_experiment, mlflow_client, prepare_store
from pipeline.sweep.tracking.tags import context_tags

if TYPE_CHECKING:
    from pipeline.sweep.tracking.buffer import TrackingBuffer

log = logging.getLogger(__name__)

PARENT_FILE = "mlflow_parent_run.json"  # in the Ray experiment dir: the parent run, reused on restore
TRIALS_ARTIFACT = "sweep_trials.json"  # on the parent: per trial, its run and whether it was trained, resumed, reused


@dataclass(frozen=True)
class ParentRun:
    tracking_uri: str
    experiment_id: str
    parent_run_id: str


def store_key(uri: str, project_root: Path) -> str:
    """Which store ``uri`` is, independent of where the project lies: a sqlite file inside the project is named by its
    path relative to the project, so a moved or copied project (another checkout, a cluster head) still finds the
    parent run; any other store is its URI."""
    if uri.startswith("sqlite:///"):
        database = Path(uri.removeprefix("sqlite:///")).resolve()
        if database.is_relative_to(project_root.resolve()):
            return f"project:{database.relative_to(project_root.resolve()).as_posix()}"
    return uri


def open_parent_run(
    uri: str,
    experiment: str,
    experiment_dir: StoragePath,
    *,
    run_name: str,
    tags: dict[str, str],
    params: dict[str, str],
    project_root: Path,
    default_store: bool = False,
) -> ParentRun:
    """The parent run: the one recorded in ``experiment_dir`` (a restored run), else a new one in ``experiment``
    (created when missing). ``default_store``: ``uri`` is the project-local default (``tracking.uri`` unset), whose
    artifact locations follow the project when it is copied or moved; a store the user named is never rewritten."""
    prepare_store(uri, project_root / ARTIFACTS_DIR if default_store else None)
    client = mlflow_client(uri)
    location = artifact_root(uri, project_root)
    experiment_id = ensure_experiment(client, experiment, location, created_after=f"{experiment}{CLAIMS_SUFFIX}")
    record = experiment_dir / PARENT_FILE
    if record.is_file():
        saved = json.loads(record.read_text())
        if saved.get("store", saved.get("tracking_uri")) == store_key(uri, project_root):
            try:
                client.update_run(saved["parent_run_id"], status="RUNNING")
                log.info("MLflow: continuing parent run %s (%s)", saved["parent_run_id"], uri)
                return ParentRun(uri, saved["experiment_id"], saved["parent_run_id"])
            except MlflowException as err:
                log.warning("MLflow: recorded parent run not usable (%s); starting a new one", err)
    run = client.create_run(experiment_id, run_name=run_name, tags={**context_tags(), **tags})
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
    parent = ParentRun(uri, experiment_id, run.info.run_id)
    saved = {
        "tracking_uri": uri,
        "store": store_key(uri, project_root),
        "experiment_id": experiment_id,
        "parent_run_id": parent.parent_run_id,
    }
    record.write_text(json.dumps(saved))
    log.info("MLflow: parent run %s in experiment %r (%s)", parent.parent_run_id, experiment, uri)
    return parent


def parent_finished(experiment_dir: StoragePath, uri: str) -> bool:
    """Whether the parent run recorded in ``experiment_dir`` ended FINISHED in the store at ``uri`` (False when it
    cannot be told)."""
    record = experiment_dir / PARENT_FILE
    if not record.is_file():
        return False
    try:
        parent_run_id = json.loads(record.read_text())["parent_run_id"]
        return mlflow_client(uri).get_run(parent_run_id).info.status == "FINISHED"
    except (MlflowException, KeyError, ValueError):
        return False


def record_trials(parent: ParentRun, trials: list[dict[str, Any]], buffer: TrackingBuffer) -> None:
    """The parent run's ``sweep_trials.json``: per trial, its run and whether this run trained, resumed or reused it
    (a reused or resumed run keeps the parent that started it: MLflow runs are not re-parented)."""
    buffer.log_dict(parent.parent_run_id, {"trials": trials}, TRIALS_ARTIFACT)


def finish_parent(parent: ParentRun, status: str, tags: dict[str, str] | None, buffer: TrackingBuffer) -> None:
    if tags:
        buffer.set_tags(parent.parent_run_id, tags)
    buffer.set_terminated(parent.parent_run_id, status)
