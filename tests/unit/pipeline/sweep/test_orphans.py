"""Reaping a dead driver's local Ray ends only that session's processes: found by its folder, and only when the
driver that marked it is gone (real processes stand in for Ray's agents: they hold a log of the session open)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline.sweep.orphans import MARK_FILE, driver_alive, mark_session, reap_dead_sessions

HOLD_LOG = "import sys, time; f = open(sys.argv[1], 'a'); print('ray', flush=True); time.sleep(120)"


def _agent(session: Path) -> subprocess.Popen:
    """A process that holds ``<session>/logs/agent.log`` open, as Ray's agents hold their logs."""
    (session / "logs").mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOG, str(session / "logs/agent.log"), "ray-agent"], stdout=subprocess.PIPE
    )
    assert process.stdout is not None and process.stdout.readline()  # the file is open
    return process


@pytest.fixture
def dead_pid() -> dict:
    """The mark of a driver that has exited."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(gone.pid).create_time()
    gone.wait()
    return {"pid": gone.pid, "create_time": created}


def test_a_dead_drivers_session_is_ended_and_unmarked(tmp_path: Path, dead_pid: dict) -> None:
    session = tmp_path / "session_dead"
    agent = _agent(session)
    (session / MARK_FILE).write_text(json.dumps(dead_pid))
    try:
        assert reap_dead_sessions(tmp_path) == 1
        assert agent.wait(timeout=10) is not None
        assert not (session / MARK_FILE).exists()
        assert reap_dead_sessions(tmp_path) == 0  # nothing left to do
    finally:
        agent.kill()


def test_a_live_drivers_session_and_an_unmarked_one_are_left_alone(tmp_path: Path) -> None:
    live, unmarked = tmp_path / "session_live", tmp_path / "session_other"
    agents = [_agent(live), _agent(unmarked)]
    mark_session(live)  # this process: alive
    try:
        assert driver_alive(json.loads((live / MARK_FILE).read_text()))
        assert reap_dead_sessions(tmp_path) == 0
        time.sleep(0.2)
        assert [agent.poll() for agent in agents] == [None, None]
    finally:
        for agent in agents:
            agent.kill()


def test_a_reused_pid_is_not_the_driver(dead_pid: dict) -> None:
    me = psutil.Process()
    assert not driver_alive({"pid": me.pid, "create_time": me.create_time() - 100})
    assert not driver_alive(dead_pid) and not driver_alive({})
