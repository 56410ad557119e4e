"""No orphans: a driver SIGKILLed while its own local Ray trains leaves Ray's agents running (Ray 2.60 ends its GCS
server and raylet with the driver, not the raylet's agents); the next run of a stage ends every process of that dead
session, and only of that one."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def _of_session(session: Path) -> list[str]:
    """The processes (title and pid) that name the session folder or hold one of its files open."""
    prefix, found = f"{session}/", []
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            named = any(prefix in arg for arg in process.info["cmdline"] or ())
            if named or any(f.path.startswith(prefix) for f in process.open_files()):
                found.append(f"{process.info['name']} ({process.pid})")
        except psutil.Error:
            continue
    return found


def _session_once_training(stage: subprocess.Popen, timeout_s: float = 180) -> Path:
    """The session folder of the local Ray the stage started, once a trial trains there and the agents run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and stage.poll() is None:
        try:
            processes = psutil.Process(stage.pid).children(recursive=True)
            titles = {" ".join(p.cmdline()).strip() for p in processes}
            raylet = next((p for p in processes if p.name() == "raylet"), None)
        except psutil.Error:
            processes, titles, raylet = [], set(), None
        agents = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= titles
        if raylet is not None and agents and any(t.startswith("ray::ImplicitFunc.train") for t in titles):
            socket = next(arg for arg in raylet.cmdline() if arg.startswith("--raylet_socket_name="))
            return Path(socket.split("=", 1)[1]).parents[1]  # <session>/sockets/raylet
        time.sleep(0.2)
    stage.kill()
    raise AssertionError(f"no trial training in the stage's own Ray:\n{stage.communicate()[0][-3000:]}")


def test_the_next_run_ends_what_a_sigkilled_driver_left(project: Project, project_params: dict) -> None:
    project.dvc("repro", "prepare")
    project_params["train"]["epochs"] = 30
    project_params["sweep"].update(variants=["sa_quadratic_9"], seeds=[43], fail_once_after_epoch=None)
    project.write_params(project_params)
    env = {key: value for key, value in project.env.items() if key != "RAY_ADDRESS"}  # the stage starts its own Ray
    stage = project.start_tune(env=env)
    session = _session_once_training(stage)
    stage.send_signal(signal.SIGKILL)
    stage.communicate(timeout=30)
    time.sleep(2)  # what Ray ends with the driver has ended by now
    left = _of_session(session)
    assert any("DashboardAgent" in p for p in left) and any("RuntimeEnvAgent" in p for p in left), left
    done = subprocess.run(
        ["python", "-m", "stages.tune", "--dry-run"], cwd=project.path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"process(es) of {session} left by a driver that died (pid {stage.pid})" in done.stderr, done.stderr[-3000:]
    assert _of_session(session) == []
