"""Where a project's side-effect stores live, and keeping a copied or moved project's default store its own.

The stores (the default MLflow sqlite store and its ``mlartifacts/``, a relative ``sweep.storage_path``, the stage
locks) outlive a run; the DVC outputs (manifests, metrics) are collected by DVC from the workspace. The two differ
for ``dvc exp run --queue`` and ``--temp``: DVC runs those in a temporary copy under ``.dvc/tmp/exps/`` and deletes
it afterwards, so stores resolved there would be lost with it. Imports neither Ray nor MLflow.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from contextlib import closing
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_STORE = "mlflow.db"  # the default MLflow store (tracking.uri unset): <project>/mlflow.db
ARTIFACTS_DIR = "mlartifacts"  # beside the default store: <project>/mlflow.db, <project>/mlartifacts
# Every column of MLflow 3.17's sqlite schema that holds an artifact location (tracking and registry tables).
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def store_root(workspace: Path) -> Path:
    """The folder the stores resolve against: the DVC repository the stage runs for, else ``workspace``.

    DVC sets ``DVC_ROOT`` for every stage it runs: the repository itself for ``dvc repro``, the *parent* repository
    for a queued or ``--temp`` experiment (whose workspace under ``.dvc/tmp/exps/`` is deleted afterwards). Resolving
    the stores against it keeps those experiments' runs and checkpoints in the project's real store; the DVC outputs
    stay in the workspace, where DVC collects them. Outside DVC (``python -m stages.tune``) it is the workspace.
    """
    workspace = workspace.resolve()
    dvc_root = os.environ.get("DVC_ROOT")
    root = Path(dvc_root).resolve() if dvc_root else workspace
    if root != workspace:
        log.info(
            "stores (MLflow, Ray results, stage locks) resolve against the DVC repository %s, not the "
            "temporary workspace %s (a queued or --temp experiment)",
            root,
            workspace,
        )
    return root


def default_store_uri(project_root: Path) -> str:
    """The project's default tracking store: sqlite at an absolute ``<project>/mlflow.db`` (never ``./mlruns``)."""
    return f"sqlite:///{(project_root / DEFAULT_STORE).resolve()}"


def adopt_default_store(uri: str, configured: str | None, project_root: Path) -> None:
    """Before a later stage reads artifacts through ``uri`` (a manifest's store): when it is this project's default
    store (``tracking.uri`` unset, the database present), point the locations a copied or moved project inherited at
    its own ``mlartifacts`` (``adopt_artifact_root``); any other store is left alone."""
    database = project_root / DEFAULT_STORE
    if configured is None and uri == default_store_uri(project_root) and database.is_file():
        adopt_artifact_root(database, project_root / ARTIFACTS_DIR)


def adopt_artifact_root(database: Path, artifacts: Path) -> int:
    """Point the artifact locations in the sqlite store ``database`` that name another folder's ``mlartifacts`` at
    ``artifacts`` (this project's), in one transaction; returns the number of rows changed.

    MLflow stores absolute artifact locations (experiment roots, run, logged model and model version locations) and
    has no API to move them, so a copied project (``cp -a proj proj2``) would write its checkpoints into the
    original's folder and a moved one would find none of its artifacts. Only for the default project-local store,
    whose ``mlartifacts`` always lies beside it; a store the user named is never touched.
    """
    new = artifacts.resolve().as_uri()
    with closing(sqlite3.connect(database, timeout=20, isolation_level=None)) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        db.execute("BEGIN IMMEDIATE")
        try:
            rows = db.execute(
                "SELECT DISTINCT artifact_location FROM experiments WHERE artifact_location LIKE ?",
                (f"file://%/{ARTIFACTS_DIR}",),
            ).fetchall()
            foreign = sorted({old for (old,) in rows if old != new})
            changed = 0
            for old in foreign:
                for table, column in ARTIFACT_COLUMNS:
                    if table not in tables:
                        continue
                    changed += db.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608 - names are ours
                        f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                        (new, len(old) + 1, old, len(old) + 1, f"{old}/"),
                    ).rowcount
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    for old in foreign:
        log.info("MLflow: artifact locations moved from %s to %s (a copied or moved project's store)", old, new)
    return changed
