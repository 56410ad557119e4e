"""One running instance of a stage per project: a second one started beside it (two terminals, outside DVC's own
lock) refuses at once, naming the running one, instead of mixing its trials into the first one's runs and manifest.

``filelock``'s OS lock on a file in ``results/``: the OS releases it when the holder ends, however it ends, so there
is never a stale lock to delete by hand. The file keeps the holder's pid and start time for the refusal message.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from filelock import FileLock, Timeout

_held: dict[Path, FileLock] = {}  # the locks this process holds: dropping one would release it


class StageRunningError(ValueError):
    """Another process of this project is running the same stage (a ValueError: refused before any work, exit 2)."""


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode(), 0)


def hold_stage_lock(path: Path, stage: str) -> None:
    """Lock ``path`` for the rest of this process, or raise ``StageRunningError`` naming the process that holds it."""
    path = Path(path).resolve()
    if path in _held:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # fallback_to_soft=False: on a file system without flock, fail rather than leave a lock file a kill would strand
    lock = FileLock(path, blocking=False, fallback_to_soft=False, preserve_lock_file=True, on_acquired=_write_holder)
    try:
        lock.acquire()
    except Timeout:
        holder = path.read_text().strip() or "a process that has not written its pid yet"
        raise StageRunningError(
            f"{path}: the {stage} stage is already running in this project ({holder}); wait for it to end or stop it"
        ) from None
    _held[path] = lock
