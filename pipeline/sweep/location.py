"""Where a project's side-effect stores live, and keeping a copied or moved project's default store its own.

The stores (the default MLflow sqlite store and its ``mlartifacts/``, a relative ``sweep.storage_path``, the stage
locks) outlive a run, while DVC collects the outputs from the workspace; ``dvc exp run --queue`` / ``--temp`` run in a
temporary copy that DVC deletes, so the stores resolve against the repository (``store_root``). No Ray, no MLflow.
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
    """The folder the stores resolve against: ``DVC_ROOT``, which DVC sets for every stage it runs (the *parent*
    repository for a queued or ``--temp`` experiment, whose workspace is deleted afterwards), else ``workspace``."""
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
    ``artifacts`` (this project's), in one transaction; the rows changed. MLflow stores absolute locations and has no
    API to move them: a copied project would write into the original's folder, a moved one find none of its artifacts.
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
