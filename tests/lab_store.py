"""A lab's tracking store for the tests: ``examples/lab_store.sh``, the recipe docs/cluster.md gives, run as it is.

PostgreSQL 15 (``initdb`` + ``pg_ctl``, as the ``postgres`` user when the tests run as root) and an ``mlflow server``
on it whose artifacts go to a bucket of the tests' S3-compatible server, both on free 127.0.0.1 ports. The store's
folder is the test's: a new one under the system's temporary folder (pytest's own is closed to other users, and the
cluster runs as ``postgres``), removed at the end after the script has stopped both by the process ids it recorded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.sweep.tracking.server import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "lab_store.sh"
START_TIMEOUT_S = 180  # initdb, the cluster's start and MLflow creating its tables: 16-25 s here
PG_BIN = Path("/usr/lib/postgresql/15/bin")  # where Debian's and Ubuntu's postgresql-15 put them (the script's default)


def postgresql_missing() -> str | None:
    """Why the lab store cannot start here (no PostgreSQL server binaries), or None: the tests skip, saying so."""
    if shutil.which("initdb") or (PG_BIN / "initdb").is_file():
        return None
    return f"PostgreSQL is not installed (no initdb on PATH nor in {PG_BIN}): the lab store's tests need its server"


@dataclass
class LabStore:
    """A running lab store: ``uri`` is ``tracking.uri``; ``artifacts`` the bucket prefix the server writes to."""

    home: Path
    uri: str
    artifacts: str  # s3://<bucket>/<prefix>
    start_s: float  # wall time the script took to answer

    @property
    def server_log(self) -> Path:
        return self.home / "mlflow.log"

    def pids(self) -> dict[str, int]:
        """The process ids the script recorded (the server's, the cluster's postmaster), while they run."""
        return {name: int((self.home / f"{name}.pid").read_text()) for name in ("mlflow", "postgres")}


def _env() -> dict[str, str]:
    """The tests' environment with this venv's ``mlflow`` first on PATH (the script runs ``mlflow server``)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def start_lab_store(bucket: str, endpoint: str, prefix: str = "mlartifacts") -> LabStore:
    """``examples/lab_store.sh start`` in a new folder, artifacts to ``s3://<bucket>/<prefix>`` on ``endpoint``."""
    home = Path(tempfile.mkdtemp(prefix="lab-store-"))
    home.chmod(0o711)  # the cluster's user (postgres, under root) enters it; nothing in it is listed to others
    env = {**_env(), "PGPORT": str(free_port()), "MLFLOW_PORT": str(free_port())}
    artifacts = f"s3://{bucket}/{prefix}"
    began = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT), "start", str(home), artifacts, endpoint],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        stop_lab_store(home)
        raise
    if done.returncode != 0:
        stop_lab_store(home)
        raise RuntimeError(f"examples/lab_store.sh start failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return LabStore(home, done.stdout.strip().splitlines()[-1], artifacts, time.monotonic() - began)


def stop_lab_store(home: Path) -> None:
    """``examples/lab_store.sh stop`` (by the recorded process ids), then the folder removed."""
    try:
        subprocess.run(["bash", str(SCRIPT), "stop", str(home)], env=_env(), check=True, timeout=90)
    finally:
        shutil.rmtree(home, ignore_errors=True)
