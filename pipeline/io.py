"""Files the stages write and the failures that count as bad input, shared by every stage and benchmark.

- Outputs are written atomically (a temporary file renamed into place): a reader, DVC or an interrupted run never sees
  half a manifest.
- Output locations, and the MLflow server a stage needs, are checked before expensive work starts, so that a bad
  path or a server that is down fails first, not last.
- ``EXPECTED_FAILURES`` are the exceptions that mean "the input is bad" (a params key, a missing or corrupt file):
  entry points turn them into one line naming the key or file and exit code 2; anything else is a bug and keeps its
  traceback.
"""

from __future__ import annotations

import http.client
import json
import os
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

# ConfigError is a ValueError; library code raises ValueError for input it cannot use (a corrupt archive, a bad
# checkpoint, a stale manifest) and FileNotFoundError for one that is missing.
EXPECTED_FAILURES: tuple[type[Exception], ...] = (FileNotFoundError, ValueError)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and a rename (creating the parent folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Indented, key-sorted JSON (stable diffs for git-tracked DVC outputs), written atomically."""
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def check_creatable_dir(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` is a directory that can be written, or could be created as one (its
    nearest existing ancestor is such a directory). Tried for real with a temporary directory, removed at once:
    permission bits say nothing for root or on special file systems (/proc). Leaves nothing behind."""
    path = Path(os.path.abspath(path))
    target = path
    while not target.exists():
        target = target.parent
    if not target.is_dir():
        raise ValueError(
            f"cannot create {path}: {target} exists and is not a directory"
            if target != path
            else f"{path} exists and is not a directory"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=target))
    except OSError as err:
        raise ValueError(f"cannot write in {target}: {err.strerror or err}") from None


def check_tracking_server(uri: str, source: str, timeout_s: float = 5.0) -> None:
    """An http(s) MLflow server must answer ``/health`` now: MLflow's client would retry for minutes and fail late.
    Databases and sqlite files are opened (and created) by the client itself. ``source`` names where ``uri`` came
    from (a params key, a manifest), for the error."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as reply:
            if reply.status == 200:
                return
            problem = f"HTTP {reply.status}"
    except (OSError, ValueError, http.client.HTTPException) as err:  # refused, timeout, DNS, 4xx/5xx, a bad URL
        problem = str(err)
    raise ValueError(f"{source}: no MLflow server answers at {uri}/health ({problem}); start one or fix the URI")
