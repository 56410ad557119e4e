"""The project as a user's checkout holds it: the working tree's git-tracked and not-ignored files.

One definition for the tests that need it: the integration and cluster tests copy it into a temporary git repository
where the real ``dvc`` and stages run; the layout test reads every file of it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def project_files(root: Path = ROOT) -> list[str]:
    """Tracked and untracked-but-not-ignored files under ``root`` (relative paths): a new file counts before it is
    committed, an ignored output (``.venv``, ``results/``, ``mlflow.db``) never does."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [name for name in listed if (root / name).is_file()]  # a deleted but still tracked file is not there


def copy_project(destination: Path, root: Path = ROOT, leave_out: Iterable[str] = ("dvc.lock",)) -> Path:
    """Copy ``project_files(root)`` into ``destination`` (created if needed), without ``leave_out``: ``dvc.lock``
    by default, so the copy's first ``dvc repro`` runs its stages."""
    skipped = set(leave_out)
    for name in project_files(root):
        if name not in skipped:
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, destination / name)
    return destination
