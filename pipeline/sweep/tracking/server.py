"""A real ``mlflow server`` of our own: the tests' tracking server, the benchmarks' (load, planning at scale).

As MLflow 3.17 needs it here: ``--workers 1`` (a uvicorn worker holds ~0.5 GiB), no job runner, 127.0.0.1 only (or
the address of a bridge a test created, for the SLURM nodes in their namespaces), an
sqlite store and a proxied artifact folder; ready when ``/health`` answers; stopped by its process group, never by
name. A restart after ``kill`` is the same server (port and store): the outage tests rely on it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.sweep.tracking.store import server_answers

START_TIMEOUT_S = 90.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on a free port of ``host`` (127.0.0.1; the SLURM tests' bridge address), its sqlite store
    ``database`` (default ``home/mlflow.db``) and artifacts under ``home``; its log in ``home/server.log``."""

    def __init__(self, home: Path, database: Path | None = None, host: str = "127.0.0.1") -> None:
        self.home, self.host, self.port = Path(home), host, free_port(host)
        self.database = database or self.home / "mlflow.db"
        self.uri = f"http://{host}:{self.port}"
        self.log = self.home / "server.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start it and wait until ``/health`` answers."""
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        command = [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.database}",
            "--artifacts-destination",
            str(self.home / "mlartifacts"),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                command, cwd=self.home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"mlflow server did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.3)

    def answers(self) -> bool:
        return server_answers(self.uri)

    def kill(self) -> None:
        """Down at once, as a crashed server or a lost network (the server and its worker: our process group)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)

    def stop(self) -> None:
        """SIGTERM to the server and its uvicorn worker (our own process group), SIGKILL if they linger."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()
