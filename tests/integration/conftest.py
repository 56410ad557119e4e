"""Real tools, started once per test session: a local Ray, an MLflow server, and the project in a temporary git repo.

Everything listens on 127.0.0.1 only. The sweep's stage runs as a subprocess (``dvc repro`` or ``python -m
stages.tune``) that attaches to the session's Ray through ``RAY_ADDRESS`` and logs to the session's MLflow server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest
import yaml

from pipeline.sweep.tracking.server import MlflowServer  # the tests import it from here too
from tests.lab_store import LabStore, postgresql_missing, start_lab_store, stop_lab_store
from tests.project_copy import copy_project

if TYPE_CHECKING:
    from conftest import Bucket

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


SESSION_GPUS = 2  # declared, not present: Ray schedules GPU trials on them (tests/integration/test_gpu_scheduling.py)


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray for the session: 2 CPUs and ``SESSION_GPUS`` declared GPUs (Ray accepts GPUs a machine does not
    have; a trial that asks for none never sees them), so GPU scheduling is tested without a GPU or a second Ray."""
    import ray

    ray.init(
        num_cpus=2,
        num_gpus=SESSION_GPUS,
        include_dashboard=False,
        object_store_memory=300 * 1024**2,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def lab_bucket(new_bucket: Callable[[], Bucket]) -> Bucket:
    """The lab store's bucket: the server's artifacts under ``mlartifacts/``; tests put Ray's results under ``ray/``."""
    return new_bucket()


@pytest.fixture(scope="session")
def lab_store(lab_bucket: Bucket) -> Iterator[LabStore]:
    """A lab's tracking store, as docs/cluster.md has users start one (``examples/lab_store.sh``): PostgreSQL 15 and
    an ``mlflow server`` on it, artifacts in ``lab_bucket``; started when a test first asks, stopped by process id at
    the session's end (test_lab_store.py, test_shared_store.py: one worker's group). Skipped, saying why, on a
    machine without PostgreSQL (CI installs it: .ci/run)."""
    if missing := postgresql_missing():
        pytest.skip(missing)
    store = start_lab_store(lab_bucket.name, lab_bucket.endpoint)
    try:
        yield store
    finally:
        stop_lab_store(store.home)


def tiny_params(**sweep: object) -> dict:
    """The project's params shrunk: 2 variants, 2 epochs, smallest widths, one trial at a time (one Ray worker per
    stage run, which Tune reuses for the next trial: a second worker costs about 6 CPU-s of start-up, more than a
    tiny trial; a test of concurrency asks for more)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"].update(hidden=16, ffn=32, layers=1, learned_dim=8, resnet_width=4)
    params["train"].update(epochs=2)
    params["sweep"].update(
        variants=["sa_quadratic_9", "resnet18"],
        seeds=[0],
        max_concurrent_trials=1,
        resources={"cpu": 1, "gpu": 0},
        **sweep,
    )
    return params


@dataclass
class Project:
    """A git copy of the project where the real ``dvc`` and stages run."""

    path: Path
    env: dict[str, str]
    started: list[subprocess.Popen] = field(default_factory=list)  # the stages start_tune started, for stop_started

    def write_params(self, params: dict) -> None:
        (self.path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    def read_params(self) -> dict:
        return yaml.safe_load((self.path / "params.yaml").read_text())

    def attempt(self, *command: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run ``command`` in the project: its result whatever its exit code (a refusal the test checks)."""
        return subprocess.run(command, cwd=self.path, env=self.env, capture_output=True, text=True, timeout=timeout)

    def run(self, *command: str, timeout: float = 300) -> subprocess.CompletedProcess:
        done = self.attempt(*command, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"{command} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        return done

    def dvc(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("dvc", *args, timeout=600)  # a whole `dvc repro`: five stages, three of them Ray runs

    def start_tune(
        self, command: tuple[str, ...] = ("python", "-m", "stages.tune"), env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start the tune stage (``command``) in the project, with the project's environment or ``env``; its output
        (stdout and stderr together) readable from the returned process."""
        stage = subprocess.Popen(
            list(command),
            cwd=self.path,
            env=self.env if env is None else env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.started.append(stage)
        return stage

    def stop_started(self, timeout_s: float = 60) -> None:
        """Stop the stages this project started that still run (a test that failed before it waited for its own):
        SIGTERM, the stage's own clean stop, then SIGKILL. Left running, one holds the project's tune lock and every
        later test on the shared project fails with 'the tune stage is already running'."""
        for stage in self.started:
            if stage.poll() is None:
                stage.terminate()
                try:
                    stage.communicate(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    stage.kill()
                    stage.communicate()
        self.started.clear()

    def interrupt_tune(
        self, experiment_dir: Path, checkpoint: int, stop: signal.Signals = signal.SIGINT, timeout_s: float = 120
    ) -> tuple[int, str]:
        """Start ``python -m stages.tune``, send it ``stop`` once a trial has saved ``checkpoint_<checkpoint>``
        (0-based) under ``experiment_dir``; its exit code and output."""
        name = f"checkpoint_{checkpoint:06d}"
        return self.interrupt_tune_when(lambda: bool(list(experiment_dir.glob(f"*/{name}"))), name, stop, timeout_s)

    def interrupt_tune_when(
        self, saved: Callable[[], bool], what: str, stop: signal.Signals = signal.SIGINT, timeout_s: float = 120
    ) -> tuple[int, str]:
        """Start ``python -m stages.tune``, send it ``stop`` once ``saved()`` (``what``: what it waits for, for the
        failure message); its exit code and output."""
        stage = self.start_tune()
        deadline = time.monotonic() + timeout_s
        while not saved():
            if stage.poll() is not None or time.monotonic() > deadline:
                stage.kill()
                raise AssertionError(f"no {what} before the end:\n{stage.communicate()[0][-3000:]}")
            time.sleep(0.1)
        stage.send_signal(stop)
        output, _ = stage.communicate(timeout=120)
        return stage.returncode, output


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory, ray_address: str, mlflow_server: MlflowServer) -> Project:
    """Tracked + not-ignored files of the working tree, committed in a fresh git repo, params shrunk."""
    path = copy_project(tmp_path_factory.mktemp("project"))
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "RAY_ADDRESS": ray_address,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@localhost",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@localhost",
    }
    env.pop("PYTHONPATH", None)
    copy = Project(path, env)
    copy.write_params(
        {**tiny_params(fail_once_after_epoch=1), "tracking": {"uri": mlflow_server.uri, "experiment": "it-sweep"}}
    )
    copy.run("git", "init", "-q")
    copy.run("git", "add", "-A")
    copy.run("git", "commit", "-q", "-m", "tiny profile")
    return copy


@pytest.fixture
def project_params(project: Project) -> Iterator[dict]:
    """The shared project's params, to edit and ``project.write_params``; put back after the test, with any stage the
    test started stopped, so tests that change the sweep pass in any order. Without system metrics
    (``tracking.system_metrics``): each Ray worker would import MLflow's monitor for them, 0.4-1.1 CPU-s, and only the
    smoke sweep (test_tune_pipeline.py, on the committed params) and the outage tests check them."""
    original = (project.path / "params.yaml").read_text()
    params = project.read_params()
    params["tracking"]["system_metrics"] = False
    try:
        yield params
    finally:
        project.stop_started()
        (project.path / "params.yaml").write_text(original)


STUDY_EPOCHS = 2  # each trial's
STUDY_PRUNE_EPOCHS = 2  # the pruned model's fine-tuning


@pytest.fixture(scope="session")
def study(project: Project) -> dict:
    """One `dvc repro` (prepare, tune, prune, transform, analyze) of a study beyond the paper, for the tests that only
    read it (test_study_grid.py, test_prune_pipeline.py, test_transform_pipeline.py): the paper's generalized model
    (pruned: half the heads of each layer, then fine-tuned) and ResNet18 (rebuilt as attention: t_resnet18), a
    variant the paper does not have (`sa_quadratic_4`, hidden 24) and a two-axis grid (encoding x heads, 2 x 2). The
    dry runs, outputs and params as that run left them (later tests re-run the stages on other params); the project's
    params are put back."""
    params = project.read_params()
    original = (project.path / "params.yaml").read_text()
    params["variants"] = {
        "sa_generalized_9": {"arch": "sa", "encoding": "generalized_quadratic", "heads": 9},
        "sa_quadratic_4": {"arch": "sa", "encoding": "quadratic", "heads": 4, "hidden": 24},
        "resnet18": {"arch": "resnet18"},
    }
    params["grid"] = {"sa": {"arch": "sa", "axes": {"encoding": ["quadratic", "learned"], "heads": [1, 2]}}}
    params["train"]["epochs"] = STUDY_EPOCHS
    # Seed 31: no other test trains it, so no trial here is reused by another test's sweep (or reuses one) in the
    # shared store, whatever the order the tests run in.
    params["sweep"].update(
        variants=["sa_generalized_9", "sa_quadratic_4", "sa", "resnet18"], seeds=[31], fail_once_after_epoch=None
    )
    prune = {"variants": None, "mode": "fraction", "fraction": 0.5, "epochs": STUDY_PRUNE_EPOCHS}
    params["prune"] = {**params["prune"], **prune}
    project.write_params(params)
    try:
        dry = project.run("python", "-m", "stages.tune", "--dry-run").stdout
        project.run("dvc", "repro", timeout=900)  # five stages, three of them Ray runs: minutes on a loaded machine
        prune_dry = project.run("python", "-m", "stages.prune", "--dry-run").stdout
        plots = json.loads(project.dvc("plots", "show", "--json").stdout)["data"]
        results = project.path / "results"
        return {
            "params": params,
            "dry_run": dry,
            "prune_dry_run": prune_dry,
            "tune": json.loads((results / "tune/manifest.json").read_text()),
            "prune": json.loads((results / "prune/manifest.json").read_text()),
            "prune_metrics": json.loads((results / "prune/metrics.json").read_text()),
            "transform": json.loads((results / "transform/manifest.json").read_text()),
            "transform_metrics": json.loads((results / "transform/metrics.json").read_text()),
            "tune_metrics": json.loads((results / "tune/metrics.json").read_text()),
            "cka_tables": sorted(p.name for p in (results / "tables").glob("cka_*.csv")),
            "table": pd.read_csv(results / "tables/accuracy.csv").set_index("variant"),
            "markdown": (results / "tables/accuracy.md").read_text(),
            "metrics": json.loads((results / "analysis/metrics.json").read_text()),
            "figures": sorted(p.name for p in (results / "figures").glob("*.png")),
            "accuracy": pd.read_csv(results / "plots/accuracy.csv"),
            "locality": pd.read_csv(results / "plots/locality.csv"),
            "conv_like": pd.read_csv(results / "tables/conv_like_heads.csv"),
            "report": (results / "report.md").read_text(),
            "plots": plots,
        }
    finally:
        (project.path / "params.yaml").write_text(original)
