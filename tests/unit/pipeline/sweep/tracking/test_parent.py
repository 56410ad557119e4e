"""The parent run: found again after the project moves (its sqlite store inside the project moves too)."""

from __future__ import annotations

from pathlib import Path

from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.parent import ParentRun, open_parent_run


def test_a_moved_project_continues_its_sweep_run(tmp_path: Path) -> None:
    """The parent run is found again after ``mv project elsewhere`` (its sqlite store inside the project moves too);
    a different store never reuses it."""
    import shutil

    first = tmp_path / "project"

    def open_in(root: Path, uri: str | None = None) -> ParentRun:
        uri = uri or f"sqlite:///{root / 'mlflow.db'}"
        return open_parent_run(
            uri,
            "moved",
            StoragePath(root / "results/ray/tune-x"),
            run_name="tune-x",
            tags={},
            params={},
            project_root=root,
        )

    sweep = open_in(first)
    moved = shutil.move(first, tmp_path / "moved")
    again = open_in(Path(moved))
    assert again.parent_run_id == sweep.parent_run_id and again.tracking_uri.endswith("/moved/mlflow.db")
    other = open_in(Path(moved), f"sqlite:///{tmp_path / 'other.db'}")
    assert other.parent_run_id != sweep.parent_run_id


def test_the_study_lists_before_its_claims_on_mlflows_home_page(tmp_path: Path) -> None:
    """MLflow's home page and experiments list ask for the last updated experiments first; a new store's study
    experiment comes before ``<study>.claims`` (created first for that), which a sweep creates at its first claim."""
    from pipeline.sweep.tracking.claims import TrialClaims
    from pipeline.sweep.tracking.store import mlflow_client

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = open_parent_run(
        uri, "study", StoragePath(tmp_path / "tune-x"), run_name="tune", tags={}, params={}, project_root=tmp_path
    )
    claims = TrialClaims(uri, "study", parent.parent_run_id, "here", timeout_s=60)
    assert claims.experiment_id  # what the first claim does
    shown = mlflow_client(uri).search_experiments(max_results=5, order_by=["last_update_time DESC"])  # the home page's
    assert [experiment.name for experiment in shown] == ["study", "study.claims", "Default"]
