"""Checks on output locations, made before expensive work starts so that a bad path fails first, not last."""

from __future__ import annotations

import os
from pathlib import Path


def check_creatable_dir(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` is a writable directory or could be created as one (its nearest
    existing ancestor is a writable directory). Creates nothing."""
    path = Path(path).absolute()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{path} is not writable")
        return
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"cannot create {path}: {ancestor} exists and is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"cannot create {path}: {ancestor} is not writable")
