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
