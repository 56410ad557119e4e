"""The study submitted to a real SLURM cluster with ``examples/slurm/study.sbatch``, as docs/cluster.md tells a lab.

Three SLURM nodes of one CPU each, each in its own network namespace (``tests/cluster/slurm.py``); the job starts a
Ray cluster over them with ``srun`` and runs ``dvc repro`` in a git copy of the project on the head; the tracking
server listens on the bridge every node reaches. The environment the job is submitted with has no Python of the
project's first on PATH: the script runs the environment it is given (``PROJECT_VENV``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from pipeline.sweep.tracking.server import MlflowServer
from tests.cluster.conftest import epochs_logged, run_tags, tiny_cluster_params
from tests.cluster.slurm import SlurmCluster
from tests.cluster.test_gpu_nodes import batches_per_epoch
from tests.project_copy import copy_project

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "examples/slurm/study.sbatch"
VENV = Path(sys.executable).parent.parent
PACED = Path(__file__).with_name("paced_batches")
JOB_TIMEOUT_S = 600
REQUEUE_EPOCHS = 4
NOTICE_EPOCHS, NOTICE_SLEEP_S = 3, 0.25  # ~7 s epochs: the notice lands in epoch 2


def _project(path: Path, params: dict) -> Path:
    copy_project(path)
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost"}
    git.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@localhost")
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "study"]):
        subprocess.run(command, cwd=path, env=git, check=True, capture_output=True)
    return path


def _submit_env(**extra: str) -> dict[str, str]:
    """The submitting shell: the project's environment named by PROJECT_VENV, but not on PATH (a job that ran the
    first ``python`` on PATH would not find the project's dependencies), nothing of Ray's or pytest's."""
    venv_bin = str(VENV / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_", "SLURM_"))}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p not in (venv_bin, ""))
    env.update(PROJECT_VENV=str(VENV), MLFLOW_DISABLE_TELEMETRY="true", **extra)
    return env


def _dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV / "bin" / "dvc"), *args], cwd=project, capture_output=True, text=True, timeout=120, check=True
    )


def _ray_nodes(log: str, cluster: SlurmCluster) -> dict[str, str]:
    """Ray node id -> SLURM node, from the lines the script prints once every node has joined."""
    by_address = {address: name for name, address in cluster.nodes.items()}
    return {node: by_address[ip] for node, ip in re.findall(r"study\.sbatch: ray node (\w+) at (\S+)", log)}


def _outputs(project: Path) -> list[Path]:
    """Every output dvc.yaml declares (outs, metrics, plots), as paths in ``project``."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    paths = []
    for stage in yaml.safe_load((project / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                name = next(iter(entry)) if isinstance(entry, dict) else entry
                paths.append(project / name.replace("${data.prepared_dir}", params["data"]["prepared_dir"]))
    return paths


def _run_job(cluster: SlurmCluster, project: Path, env: dict[str, str], *args: str) -> tuple[int, Path]:
    log = project.parent / "job-%j.out"
    job = cluster.sbatch(f"--output={log}", SCRIPT, *args, cwd=project, env=env)
    return job, project.parent / f"job-{job}.out"


def _finish(cluster: SlurmCluster, job: int, log: Path) -> str:
    state = cluster.wait_for_job(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, JOB_TIMEOUT_S)
    text = log.read_text(errors="replace")
    assert state == "COMPLETED", f"job {job} {state}: {cluster.job(job)}\n{text[-8000:]}"
    return text


def test_slurm_job_runs_the_whole_study(
    slurm_cluster: SlurmCluster, slurm_tracking: MlflowServer, tmp_path: Path
) -> None:
    params = tiny_cluster_params(uri=slurm_tracking.uri)
    params["sweep"]["variants"] = ["sa_generalized_9", "resnet18"]  # a model to prune, the ResNet18 to transform
    params["prune"].update(variants=None, mode="fraction", fraction=0.5, epochs=1)
    params["transform"].update(epochs=1)
    project = _project(tmp_path / "project", params)
    began = time.monotonic()
    job, log = _run_job(slurm_cluster, project, _submit_env())
    text = _finish(slurm_cluster, job, log)
    print(f"the whole study as one SLURM job (3 nodes, 2 trials x 1 epoch): {time.monotonic() - began:.1f} s")

    ray_nodes = _ray_nodes(text, slurm_cluster)
    assert sorted(ray_nodes.values()) == sorted(slurm_cluster.nodes), text[-4000:]  # one Ray node per SLURM node
    manifest = json.loads((project / "results/tune/manifest.json").read_text())
    assert [t["status"] for t in manifest["trials"]] == ["finished", "finished"]
    tags = run_tags(slurm_tracking.database)
    trial_runs = {run: t for run, t in tags.items() if t.get("mlflow.parentRunId") == manifest["parent_run_id"]}
    assert set(trial_runs) == {t["run_id"] for t in manifest["trials"]}  # one run per trial, under the sweep's parent
    trained_on = {ray_nodes[t["ray.node_id"]] for t in trial_runs.values()}
    assert len(trained_on) == 2, trained_on  # two trials at once on one-CPU nodes: two SLURM nodes
    for output in _outputs(project):
        assert output.exists(), f"{output.relative_to(project)}: not written by the job"
    assert json.loads(_dvc(project, "status", "--json").stdout) == {}
    # `dvc exp show` compares the job's run (the workspace) with the commit it was submitted from
    shown = list(csv.DictReader(io.StringIO(_dvc(project, "exp", "show", "--no-pager", "--csv").stdout)))
    workspace = next(row for row in shown if row["rev"] == "workspace")
    accuracy = json.loads((project / "results/tune/test_acc.json").read_text())
    assert {name: float(workspace[name]) for name in accuracy} == accuracy
    assert not list(Path("/tmp").glob(f"ray-{slurm_cluster.tag}-{job}-*")), "a node's Ray folder was left"


def _experiment_runs(database: Path, experiment: str) -> dict[str, tuple[str, dict[str, str]]]:
    """Run id -> (status, tags) of every run of ``experiment`` in the server's store."""
    tags = run_tags(database)
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT r.run_uuid, r.status FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
            "WHERE e.name = ?",
            (experiment,),
        ).fetchall()
    return {run: (status, tags.get(run, {})) for run, status in rows}


def _epoch_logged(database: Path, experiment: str) -> bool:
    """Whether a trial of ``experiment`` has logged an epoch."""
    runs = _experiment_runs(database, experiment)
    return any(epochs_logged(database, run) for run in runs)


def _wait_until_gone(cluster: SlurmCluster, job: int, project: Path) -> None:
    """Until no process runs in ``project`` (the requeued job's first allocation: dvc, the stage driver), before the
    job's second allocation starts."""
    deadline = time.monotonic() + 60
    while any(_cwd(process) == project for process in psutil.process_iter()):
        state = cluster.job_state(job)  # COMPLETING (the first allocation ending), then PENDING (the second)
        assert state in ("COMPLETING", "PENDING"), f"job {job} {state} before its first allocation's processes ended"
        assert time.monotonic() < deadline, "the first allocation's processes did not end in 60 s"
        time.sleep(0.2)


def _cwd(process: psutil.Process) -> Path | None:
    try:
        return Path(process.cwd())
    except psutil.Error:
        return None


def _assert_resumed_once(
    cluster: SlurmCluster, job: int, text: str, project: Path, database: Path, experiment: str, epochs: int
) -> dict[str, dict[str, str]]:
    """A job requeued once whose second allocation finished both trials of its sweep: both allocations in the one log
    (``--open-mode=append``), one MLflow run per trial across them with each epoch logged once, each finished, no run
    left RUNNING. Returns the trials' runs (run id -> tags)."""
    assert cluster.job(job)["Restarts"] == "1"
    assert text.count("study.sbatch: job") == 2, text[-6000:]
    manifest = json.loads((project / "results/tune/manifest.json").read_text())
    assert [t["status"] for t in manifest["trials"]] == ["finished", "finished"]
    runs = _experiment_runs(database, experiment)
    trial_runs = {run: tags for run, (_, tags) in runs.items() if "variant" in tags}
    assert sorted(trial_runs) == sorted(t["run_id"] for t in manifest["trials"])
    for run, tags in trial_runs.items():
        assert epochs_logged(database, run) == list(range(1, epochs + 1))
        assert tags.get("tune.status") == "finished" and "tune.failure_reason" not in tags
    assert [run for run, (status, _) in runs.items() if status != "FINISHED"] == []
    return trial_runs


def test_slurm_requeued_job_resumes_every_trial(
    slurm_cluster: SlurmCluster, slurm_tracking: MlflowServer, tmp_path: Path
) -> None:
    params = tiny_cluster_params(uri=slurm_tracking.uri, system_metrics=False)
    params["tracking"]["experiment"] = experiment = "slurm-requeue"
    params["train"]["epochs"] = REQUEUE_EPOCHS
    project = _project(tmp_path / "project", params)
    pace = tmp_path / "paced.json"  # test-only: a sleep per batch, so the requeue lands mid-sweep
    pace.write_text(json.dumps({"sleep_s": 0.15, "log": str(tmp_path / "batches.log")}))
    env = _submit_env(PYTHONPATH=str(PACED), PACED_BATCHES=str(pace))
    began = time.monotonic()
    job, log = _run_job(slurm_cluster, project, env, "tune")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not _epoch_logged(slurm_tracking.database, experiment):
        assert slurm_cluster.job_state(job) in ("PENDING", "RUNNING"), log.read_text()[-6000:]
        assert time.monotonic() < deadline, "no epoch logged"
        time.sleep(0.5)
    slurm_cluster.command("scontrol", "requeue", str(job))
    requeued = time.monotonic()
    # What a `dvc repro` killed while rewriting its rwlock at the requeue leaves (seen once in CI): an empty
    # .dvc/tmp/rwlock, which every later `dvc repro` refuses. Written once the first allocation's processes are gone.
    _wait_until_gone(slurm_cluster, job, project)
    (project / ".dvc/tmp/rwlock").write_text("")
    text = _finish(slurm_cluster, job, log)
    assert "study.sbatch: .dvc/tmp/rwlock unreadable (0 bytes" in text, text[-6000:]
    print(
        f"requeued at {requeued - began:.1f} s, done at {time.monotonic() - began:.1f} s "
        f"(restarts: {slurm_cluster.job(job)['Restarts']})"
    )

    _assert_resumed_once(slurm_cluster, job, text, project, slurm_tracking.database, experiment, REQUEUE_EPOCHS)
    assert json.loads(_dvc(project, "status", "--json", "tune").stdout) == {}


def test_slurm_notice_drains_requeues_and_resumes(
    slurm_cluster: SlurmCluster, slurm_tracking: MlflowServer, tmp_path: Path
) -> None:
    """SLURM's notice (``#SBATCH --signal=B:USR1@60`` in study.sbatch) once both trials logged epoch 1: the script
    drains every Ray node for preemption, each trial saves its epoch in progress at the next batch, the job requeues
    itself, and the next allocation resumes each trial from that batch. ``scancel --batch --signal=USR1`` sends USR1
    to the batch shell alone, as SLURM does at the time limit's notice (or a preemption's, with
    ``preempt_send_user_signal``); sent here by hand, not waiting up to a minute for SLURM's check of time limits."""
    epochs = NOTICE_EPOCHS
    params = tiny_cluster_params(uri=slurm_tracking.uri, system_metrics=False)
    params["tracking"]["experiment"] = experiment = "slurm-notice"
    params["train"]["epochs"] = epochs
    project = _project(tmp_path / "project", params)
    pace, batch_log = tmp_path / "paced.json", tmp_path / "batches.log"  # test-only: a sleep and a record per batch
    pace.write_text(json.dumps({"sleep_s": NOTICE_SLEEP_S, "log": str(batch_log), "start_together": 2}))
    env = _submit_env(PYTHONPATH=str(PACED), PACED_BATCHES=str(pace))
    began, db = time.monotonic(), slurm_tracking.database
    job, log = _run_job(slurm_cluster, project, env, "tune")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while sum(bool(epochs_logged(slurm_tracking.database, r)) for r in _experiment_runs(db, experiment)) < 2:
        assert slurm_cluster.job_state(job) in ("PENDING", "RUNNING"), log.read_text()[-6000:]
        assert time.monotonic() < deadline, "the two trials did not both log epoch 1"
        time.sleep(0.5)
    slurm_cluster.command("scancel", "--batch", "--signal=USR1", str(job))
    noticed = time.monotonic()
    text = _finish(slurm_cluster, job, log)
    seconds = time.monotonic() - began

    trial_runs = _assert_resumed_once(slurm_cluster, job, text, project, db, experiment, epochs)  # requeued itself
    saved = re.search(r"study\.sbatch: drain checkpoints after (\S+) s, (\d+) trial\(s\) without", text)
    assert saved and saved[2] == "0", text[-6000:]  # every running trial saved its drain checkpoint before the requeue
    # The work lost: batches trained twice, from the paced batch log of both allocations.
    batches = [line.split() for line in batch_log.read_text().splitlines() if line.startswith("batch ")]
    per_epoch = batches_per_epoch(slurm_tracking.database, next(iter(trial_runs)), params["train"]["batch_size"])
    lost = {}
    for tags in trial_runs.values():
        trial = tags["ray.trial_id"]
        assert [b for b in batches if b[1] == trial and b[3] == "1"], f"trial {trial} saw no notice"
        trained = [b for b in batches if b[1] == trial and b[3] == "0"]
        lost[trial] = (len(trained) - epochs * per_epoch) / per_epoch
        assert 0 <= lost[trial] < 0.1, f"trial {trial} lost {lost[trial]:.0%} of an epoch ({len(trained)} batches)"
    print(
        f"notice at {noticed - began:.1f} s, drain checkpoints {saved[1]} s after the drain, done at {seconds:.1f} s; "
        f"lost per trial: {', '.join(f'{v:.1%}' for v in lost.values())} of an epoch ({per_epoch} batches)"
    )
