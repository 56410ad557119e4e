"""One running instance of a stage per project: a second one started beside it (two terminals, outside DVC's own
lock) refuses at once, naming the running one, instead of mixing its trials into the first one's runs and manifest.

The lock is ``fcntl.flock`` on a file in the project's ``results/``: the OS releases it when the holding process ends,
however it ends (SIGKILL included), so there is never a stale lock to delete by hand. The file keeps the holder's pid
and start time for the refusal message.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

_held: dict[Path, IO[str]] = {}  # open lock files of this process: closing one would release its lock


class StageRunningError(ValueError):
    """Another process of this project is running the same stage (a ValueError: refused before any work, exit 2)."""


def hold_stage_lock(path: Path, stage: str) -> None:
    """Lock ``path`` for the rest of this process, or raise ``StageRunningError`` naming the process that holds it."""
    path = Path(path).resolve()
    if path in _held:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not written its pid yet"
        handle.close()
        raise StageRunningError(
            f"{path}: the {stage} stage is already running in this project ({holder}); wait for it to end or stop it"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
    handle.flush()
    _held[path] = handle
