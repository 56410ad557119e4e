"""Files the stages write and the failures that count as bad input, shared by every stage and benchmark.

- Outputs are written atomically (a temporary file renamed into place): a reader, DVC or an interrupted run never sees
  half a manifest.
- Output locations, and the MLflow server a stage needs, are checked before expensive work starts, so that a bad
  path or a server that is down fails first, not last.
- ``EXPECTED_FAILURES`` are the exceptions that mean "the input is bad" (a params key, a missing or corrupt file):
  entry points turn them into one line naming the key or file and exit code 2; anything else is a bug and keeps its
  traceback.
- ``lasting_os_error`` tells a disk fault no retry fixes (full, over quota, read-only, refused) from a passing one:
  a trial that meets one is not retried (every retry would write to the same disk), and ``StorageFaultError`` ends
  the stage in one line naming the storage and what to do.
- ``write_stage_metrics`` writes a training stage's two metrics files: ``metrics.json`` (every figure per variant,
  a plain output) and ``test_acc.json`` (the final test accuracy per variant alone, the file dvc.yaml declares as
  metrics), so ``dvc exp show`` gives each variant one column, named after it.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import sqlite3
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

# ConfigError is a ValueError; library code raises ValueError for input it cannot use (a corrupt archive, a bad
# checkpoint, a stale manifest) and FileNotFoundError for one that is missing.
EXPECTED_FAILURES: tuple[type[Exception], ...] = (FileNotFoundError, ValueError)

# OS errors on a disk that a retry cannot fix, with what the user does about each (a full disk does not empty itself).
LASTING_OS_ERRORS: dict[int, str] = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space there or raise the quota",
    errno.EROFS: "make it writable",
    errno.EACCES: "give this user write access",
    errno.EPERM: "give this user write access",
}


def error_chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err`` and what it was raised from or while handling (``__cause__``, ``__context__``, Ray's
    ``RayTaskError.cause``), in that order, each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        yield err
        seen.add(id(err))
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__


def lasting_os_error(err: BaseException | None) -> OSError | None:
    """The ``OSError`` in ``err``'s chain whose errno is one of ``LASTING_OS_ERRORS``; None when there is none (a
    passing fault, or not a disk's)."""
    found = (e for e in error_chain(err) if isinstance(e, OSError) and e.errno in LASTING_OS_ERRORS)
    return next(found, None)


class StorageFaultError(OSError):
    """A write to ``where`` (``sweep.storage_path``, or another output of a stage) failed for a reason no retry fixes:
    one line naming it, ``what`` was being written, and what to do; a re-run after the fix continues the work."""

    def __init__(self, where: str, cause: OSError, key: str | None = "sweep.storage_path", what: str = "") -> None:
        code = cause.errno or errno.EIO
        super().__init__(code, os.strerror(code), where)
        self.key = key
        self.what = what

    def __str__(self) -> str:
        named = f"{self.key} {self.filename}" if self.key else str(self.filename)
        move = f" or set {self.key} to another location" if self.key else ""
        doing = f" while {self.what}" if self.what else ""
        return (
            f"cannot write {named} ({self.strerror}){doing}: {LASTING_OS_ERRORS.get(self.errno, 'fix it')}{move}, "
            "then re-run: finished work is kept and the run continues from its last checkpoints"
        )


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and a rename (creating the parent folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err  # a full disk's write names no file: name it
    tmp.replace(path)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Indented, key-sorted JSON (stable diffs for git-tracked DVC outputs), written atomically."""
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


METRICS_FILE = "metrics.json"  # a training stage's figures per variant: accuracies, seeds, spread
HEADLINE_FILE = "test_acc.json"  # of those, the final test accuracy per variant: what DVC compares experiments on


def write_stage_metrics(out_dir: Path, summary: dict[str, dict[str, Any]]) -> None:
    """Write ``summary`` ({variant: {"test_acc": ..., ...}}) to ``out_dir/metrics.json`` and its ``test_acc`` per
    variant, flat, to ``out_dir/test_acc.json``: a flat file keeps ``dvc exp show`` to one short column per variant
    (``resnet18``), where the whole summary made three to five per variant (``resnet18.test_acc``, ...)."""
    write_json_atomic(Path(out_dir) / METRICS_FILE, summary)
    write_json_atomic(Path(out_dir) / HEADLINE_FILE, {name: entry["test_acc"] for name, entry in summary.items()})


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


SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_path(uri: str) -> Path | None:
    """The database file of an ``sqlite:///`` store, None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def check_store(uri: str, named_by: Path | None = None) -> None:
    """Refuse, in one line naming the file and the fix, an sqlite store that is unreadable (not a database, no MLflow
    tables) or that is missing where ``named_by`` (a manifest) says runs live: MLflow would otherwise create a new empty
    store there and fail later with ``No Experiment with id=...``, or print a long SQLAlchemy traceback. A missing
    store that nothing names is a new project's: created on first use. Other stores are checked by their server."""
    database = sqlite_path(uri)
    if database is None:
        return
    if not database.exists():
        if named_by is not None:
            raise ValueError(
                f"{database}: the MLflow store that {named_by} names is missing; restore the file (or set "
                f"tracking.uri to where it is now), or start over with a new store: delete {named_by} and run "
                "`dvc repro --force tune` (its earlier runs are not in the new store)"
            )
        return
    fix = (
        f"restore {database} from a backup, or move it aside and run `dvc repro --force tune` to start a new store "
        "(the runs in it are lost to this project)"
    )
    try:
        with database.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
        if database.stat().st_size and header != SQLITE_HEADER:
            raise ValueError(f"{database}: not an sqlite database (corrupt MLflow store); {fix}")
        with closing(sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True, timeout=20)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            problem = db.execute("PRAGMA quick_check").fetchone()[0] if tables else None
    except sqlite3.DatabaseError as err:
        raise ValueError(f"{database}: unreadable MLflow store ({err}); {fix}") from None
    if problem not in (None, "ok"):
        raise ValueError(f"{database}: corrupt MLflow store (sqlite quick_check: {problem}); {fix}")
    if "experiments" not in tables and (named_by is not None or tables):
        raise ValueError(f"{database}: holds no MLflow store (no experiments table); {fix}")
