"""No orphans: the processes of a local Ray whose driver died without shutting it down are ended by the next run.

``ray.init`` ties the GCS server and the raylet to the driver, but the raylet's agents (and a raylet or worker caught
mid-start) outlive a SIGKILLed driver. ``mark_session`` writes the driver's pid and start time into the session's own
folder; every later run (``reap_dead_sessions``, before Ray is imported) ends the processes of a session whose driver
is gone: this user's, found by the session folder in their command line or among their open files. A session
without our mark (``ray start``, another program's Ray, the tests'), or whose driver lives, is never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

MARK_FILE = "pipeline_driver.json"
TERM_WAIT_S = 3.0


def ray_temp_root() -> Path:
    """Where Ray keeps its session folders on this machine, found as Ray 2.60 finds it
    (``ray._common.utils.get_default_ray_temp_dir``) without importing Ray: ``$RAY_TMPDIR``, on Linux ``$TMPDIR``,
    else ``/tmp``; then ``ray``."""
    if "RAY_TMPDIR" in os.environ:
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        base = os.environ["TMPDIR"]
    else:
        base = "/tmp" if sys.platform.startswith(("linux", "darwin")) else tempfile.gettempdir()
    return Path(base) / "ray"


def mark_session(session_dir: str | Path) -> None:
    """Record this driver as the owner of the local Ray session at ``session_dir``."""
    me = psutil.Process()
    mark = {"pid": me.pid, "create_time": me.create_time()}
    (Path(session_dir) / MARK_FILE).write_text(json.dumps(mark))


def driver_alive(mark: dict) -> bool:
    """Whether the driver a mark names still runs (the same pid and start time: a reused pid is not it)."""
    try:
        return abs(psutil.Process(int(mark["pid"])).create_time() - float(mark["create_time"])) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return False


def session_processes(session_dir: Path) -> list[psutil.Process]:
    """This user's processes that belong to the session at ``session_dir``: named in their command line, or holding
    one of its files open."""
    prefix, uid, found = f"{session_dir}{os.sep}", os.getuid(), []
    for process in psutil.process_iter(["pid", "uids", "cmdline", "name"]):
        try:
            if process.pid == os.getpid() or process.info["uids"] is None or process.info["uids"].real != uid:
                continue
            command = process.info["cmdline"] or ()
            if any(prefix in arg or arg == str(session_dir) for arg in command):
                found.append(process)
            elif "ray" in " ".join(command) and any(f.path.startswith(prefix) for f in process.open_files()):
                found.append(process)  # an agent or worker: its title hides its arguments, its logs do not
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end_processes(processes: list[psutil.Process]) -> int:
    """SIGTERM each, SIGKILL what is left after ``TERM_WAIT_S``; how many there were."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=TERM_WAIT_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=TERM_WAIT_S)
    return len(processes)


def reap_dead_sessions(root: Path | None = None) -> int:
    """End the processes of every local Ray session under ``root`` (default ``ray_temp_root``) that a dead driver of
    ours left behind; how many processes were ended. Logs one line per session reaped."""
    root = ray_temp_root() if root is None else root
    ended = 0
    for mark_file in sorted(root.glob(f"session_*/{MARK_FILE}")):
        try:
            mark = json.loads(mark_file.read_text())
        except (OSError, ValueError):
            continue
        if driver_alive(mark):
            continue
        processes = session_processes(mark_file.parent)
        if processes:
            names = sorted({p.info["name"] or str(p.pid) for p in processes})
            log.warning(
                "ray: ending %d process(es) of %s left by a driver that died (pid %s): %s",
                len(processes),
                mark_file.parent,
                mark.get("pid"),
                ", ".join(names),
            )
            ended += end_processes(processes)
        mark_file.unlink(missing_ok=True)
    return ended
