"""Checks on output locations, made before expensive work starts so that a bad path fails first, not last."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_creatable_dir(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` is a directory that can be written, or could be created as one (its
    nearest existing ancestor is such a directory). Tried for real with a temporary directory, removed at once:
    permission bits say nothing for root or on special file systems (/proc). Leaves nothing behind."""
    path = Path(os.path.abspath(path))
    target = path
    while not target.exists():
        target = target.parent
    if not target.is_dir():
        raise ValueError(f"cannot create {path}: {target} exists and is not a directory" if target != path
                         else f"{path} exists and is not a directory")  # fmt: skip
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=target))
    except OSError as err:
        raise ValueError(f"cannot write in {target}: {err.strerror or err}") from None
