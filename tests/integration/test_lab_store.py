"""The lab's store, for real: the study through an ``mlflow server`` on PostgreSQL 15 with its artifacts in a bucket,
started by ``examples/lab_store.sh`` (the recipe docs/cluster.md gives), Ray's results in the same S3-compatible
server.

What a lab's users rely on, each on the real tools: the whole ``dvc repro`` (prepare, tune, prune, analyze) of one
clone; a second clone of the same study on the same store trains nothing (every trial and the pruned model's
fine-tuning are reused by identity); a third clone, holding nothing but the two manifests, writes the report from
the server alone; and no artifact takes a path on a disk: trials checkpoint into the bucket from their Ray worker,
the driver hands them to the server's artifact proxy, and the server writes them to the bucket.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import Project, tiny_params
from tests.lab_store import LabStore
from tests.project_copy import copy_project

if TYPE_CHECKING:
    from conftest import Bucket

pytestmark = pytest.mark.slow
EXPERIMENT = "lab"
MANIFESTS = ("results/tune/manifest.json", "results/prune/manifest.json")
TRANSFORM_MANIFEST = "results/transform/manifest.json"  # the rebuilt ResNet18's fine-tuning: a run of its own
# A request in the server's access log (uvicorn's: '127.0.0.1:49538 - "PUT /api/2.0/mlflow-artifacts/... HTTP/1.1" 200')
REQUEST = re.compile(r'"(?P<method>[A-Z]+) (?P<path>/api/\S+) HTTP/1\.1" (?P<status>\d+)')


def _clone(project: Project, path: Path, params: dict) -> Project:
    """A fresh clone of the session's project (its files as git holds them) at ``path``, with ``params``."""
    clone = Project(copy_project(path, root=project.path), {**project.env})
    clone.write_params(params)
    clone.run("git", "init", "-q")
    clone.run("git", "add", "-A")
    clone.run("git", "commit", "-q", "-m", "the lab's study")
    return clone


def _study_params(store: LabStore, bucket: Bucket) -> dict:
    """The tiny profile with a model to prune, Ray's results in the bucket, the lab's server as the store."""
    params = tiny_params(storage_path=bucket.uri("ray"))
    params["sweep"]["variants"] = ["sa_generalized_9", "resnet18"]
    params["prune"].update(variants=None, mode="fraction", fraction=0.5, epochs=1)
    params["tracking"] = {"uri": store.uri, "experiment": EXPERIMENT, "system_metrics": False}
    return params


@pytest.fixture(scope="module")
def lab_study(
    project: Project, lab_store: LabStore, lab_bucket: Bucket, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """Clone A's whole ``dvc repro`` against the lab's store, as a new user's first run."""
    params = _study_params(lab_store, lab_bucket)
    clone = _clone(project, tmp_path_factory.mktemp("lab-a") / "project", params)
    began = time.monotonic()
    repro = clone.dvc("repro")
    return {
        "clone": clone,
        "output": repro.stdout + repro.stderr,
        "params": params,
        "repro_s": time.monotonic() - began,
        "tune": json.loads((clone.path / MANIFESTS[0]).read_text()),
        "prune": json.loads((clone.path / MANIFESTS[1]).read_text()),
        "transform": json.loads((clone.path / TRANSFORM_MANIFEST).read_text()),
    }


def _trial_runs(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return [r for r in client.search_runs([experiment.experiment_id]) if "trial_key" in r.data.tags]


def test_the_whole_repro_runs_on_postgresql_and_a_bucket(lab_study: dict, lab_store: LabStore) -> None:
    """Prepare, tune, prune, transform and analyze against the lab's server: one run per trial and for each
    fine-tuning (the pruned model's, the rebuilt ResNet18's), all FINISHED with every epoch once, no run or claim left
    RUNNING, the report written."""
    tune, prune = lab_study["tune"], lab_study["prune"]
    assert tune["tracking_uri"] == prune["tracking_uri"] == lab_store.uri
    assert sorted(t["variant"] for t in tune["trials"]) == ["resnet18", "sa_generalized_9"]
    assert all(t["status"] == "finished" for t in tune["trials"])
    [model] = prune["models"]
    assert model["status"] == "finished"
    client = MlflowClient(lab_store.uri)
    runs = _trial_runs(client)
    [rebuilt] = lab_study["transform"]["models"]
    assert rebuilt["status"] == "finished"
    expected = [*(t["run_id"] for t in tune["trials"]), model["run_id"], rebuilt["run_id"]]
    assert sorted(r.info.run_id for r in runs) == sorted(expected)
    assert all(r.info.status == "FINISHED" for r in runs)
    for name in (EXPERIMENT, f"{EXPERIMENT}.claims"):  # parents, the analysis, the claims: all ended
        experiment_id = client.get_experiment_by_name(name).experiment_id
        assert not [r.info.run_name for r in client.search_runs([experiment_id]) if r.info.status == "RUNNING"]
    for trial in tune["trials"]:
        steps = [m.step for m in client.get_metric_history(trial["run_id"], "test_acc")]
        assert steps == [1, 2]  # every epoch once
    report = (lab_study["clone"].path / "results/report.md").read_text()
    assert "figures/fig4_accuracy.png" in report
    # MLflow's "View run" lines (and the run read back to print them) for every trial run ended: not printed
    assert not [line for line in lab_study["output"].splitlines() if "View run" in line and " seed " in line]
    print(f"lab store started in {lab_store.start_s:.1f} s; clone A's dvc repro {lab_study['repro_s']:.1f} s")


def test_a_second_clone_trains_nothing_it_reuses_every_run(
    project: Project, lab_study: dict, lab_store: LabStore, lab_bucket: Bucket, tmp_path: Path
) -> None:
    """Clone B, the same study on the same store after clone A, its Ray results under a prefix of its own (a
    teammate's): every trial and the pruned model's fine-tuning are found by identity in PostgreSQL and reused; the
    store still holds one run per identity. (With clone A's prefix, B would restore A's finished Tune experiment and
    list A's sweep as its own: no run trained either, but the store's lookup untested.)"""
    client = MlflowClient(lab_store.uri)
    before = sorted(r.info.run_id for r in _trial_runs(client))
    params = copy.deepcopy(lab_study["params"])
    params["sweep"]["storage_path"] = lab_bucket.uri("ray-b")
    clone = _clone(project, tmp_path / "project", params)
    began = time.monotonic()
    clone.dvc("repro", "prune")  # the analysis of the same runs is clone C's test
    took = time.monotonic() - began
    tune = json.loads((clone.path / MANIFESTS[0]).read_text())
    prune = json.loads((clone.path / MANIFESTS[1]).read_text())
    assert all(t["reused"] for t in tune["trials"]) and all(m["reused"] for m in prune["models"])
    first = [*lab_study["tune"]["trials"], *lab_study["prune"]["models"]]
    assert sorted(r["run_id"] for r in [*tune["trials"], *prune["models"]]) == sorted(r["run_id"] for r in first)
    runs = _trial_runs(client)
    assert sorted(r.info.run_id for r in runs) == before  # nothing trained again
    keys = [r.data.tags["trial_key"] for r in runs]
    assert len(set(keys)) == len(keys)
    print(f"clone B's dvc repro prune (everything reused) {took:.1f} s")


def test_a_third_clones_analysis_reads_only_the_server(
    project: Project, lab_study: dict, lab_store: LabStore, tmp_path: Path
) -> None:
    """Clone C holds the two manifests (as a teammate's checkout after `git pull` of clone A's results) and nothing
    else: no prepared data, no Ray results, no store, no bucket credentials, no Ray. Its analysis fetches the runs and
    their checkpoints from the server alone: every download streamed by the server (in its access log), none from a
    presigned bucket URL. (MLflow 3.17's clients fetch a file straight from an S3 destination through a presigned
    URL unless told not to, ``MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD=false``: docs/cluster.md; clone A's analysis
    took that default path.)"""
    clone = _clone(project, tmp_path / "project", lab_study["params"])
    for name in MANIFESTS:
        (clone.path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lab_study["clone"].path / name, clone.path / name)
    assert not any((clone.path / p).exists() for p in ("data/prepared", "results/ray", "mlflow.db", "mlartifacts"))
    clone.env = {k: v for k, v in clone.env.items() if not k.startswith("AWS_") and k != "RAY_ADDRESS"}
    clone.env["MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD"] = "false"  # a client that reaches only the server
    logged = lab_store.server_log.read_text().count("\n")
    clone.run("python", "-m", "stages.analyze")
    requests = [REQUEST.search(line) for line in lab_store.server_log.read_text().splitlines()[logged:]]
    requests = [r for r in requests if r]
    downloads = {r["path"] for r in requests if r["method"] == "GET" and "/mlflow-artifacts/artifacts/" in r["path"]}
    assert not [r["path"] for r in requests if "/presigned/" in r["path"]]
    client = MlflowClient(lab_store.uri)
    for run_id in [*(t["run_id"] for t in lab_study["tune"]["trials"]), lab_study["prune"]["models"][0]["run_id"]]:
        stored = client.get_run(run_id).info.artifact_uri.removeprefix("mlflow-artifacts:/")
        assert f"/api/2.0/mlflow-artifacts/artifacts/{stored}/checkpoint/checkpoint.pt" in downloads, downloads
    report = (clone.path / "results/report.md").read_text()
    assert "figures/fig4_accuracy.png" in report and (clone.path / "results/figures/fig4_accuracy.png").is_file()
    assert not any((clone.path / p).exists() for p in ("results/ray", "mlflow.db", "mlartifacts"))
    print(f"clone C's analysis: {len(requests)} requests to the server, {len(downloads)} artifact downloads")


def test_artifacts_reach_the_bucket_through_the_server_and_no_local_disk(
    lab_study: dict, lab_store: LabStore, lab_bucket: Bucket
) -> None:
    """Checkpoints, logged models and figures: the trials' Ray workers checkpoint into the bucket (Ray's storage),
    the driver reads them from there and sends them to the server's artifact proxy (``mlflow-artifacts:``), and the
    server writes them to the bucket. No folder of the driver, the workers or the server holds any of them, so a
    worker on a node that shares no disk with the driver or the server loses nothing."""
    clone: Project = lab_study["clone"]
    tune, prune = lab_study["tune"], lab_study["prune"]
    assert not (clone.path / "mlartifacts").exists() and not (clone.path / "mlflow.db").exists()
    assert not [p.name for p in (clone.path / "results/ray").glob("*-*")]  # no Tune experiment on the driver's disk
    assert not [p for p in lab_store.home.iterdir() if p.name == "mlartifacts"]  # nor beside the server
    client = MlflowClient(lab_store.uri)
    stored = set(lab_bucket.keys("mlartifacts"))
    ray_results = set(lab_bucket.keys("ray"))
    for record in [*tune["trials"], *prune["models"]]:
        run = client.get_run(record["run_id"])
        assert run.info.artifact_uri.startswith("mlflow-artifacts:/")  # the client never touched the bucket itself
        artifacts = f"mlartifacts/{run.info.artifact_uri.removeprefix('mlflow-artifacts:/')}"
        assert f"{artifacts}/checkpoint/checkpoint.pt" in stored
        # Where the trial's worker wrote it: the bucket's Ray results, never a path on a node's disk.
        trial_path = run.data.tags["ray.trial_path"]
        assert trial_path.startswith(f"s3://{lab_bucket.name}/ray/"), trial_path
        in_bucket = trial_path.split("?")[0].removeprefix(f"s3://{lab_bucket.name}/")
        assert any(k.startswith(f"{in_bucket}/checkpoint_") and k.endswith("/checkpoint.pt") for k in ray_results)
        if "model_uri" in run.data.tags:
            model = client.get_logged_model(run.data.tags["model_uri"].removeprefix("models:/"))
            assert model.artifact_location.startswith("mlflow-artifacts:/")
            location = f"mlartifacts/{model.artifact_location.removeprefix('mlflow-artifacts:/')}"
            assert f"{location}/MLmodel" in stored, sorted(k for k in stored if "/models/" in k)[:10]
    analyses = client.search_runs([tune["experiment_id"]], "tags.`analysis.role` = 'analysis'")
    assert tune["parent_run_id"] in {a.data.tags["analysis.tune_parent_run_id"] for a in analyses}  # clone A's
    for analysis in analyses:  # every analysis of the study (clone C's reuses clone A's: same manifests)
        figures = f"mlartifacts/{analysis.info.artifact_uri.removeprefix('mlflow-artifacts:/')}/figures/"
        assert f"{figures}fig4_accuracy.png" in stored
    requests = [r for r in map(REQUEST.search, lab_store.server_log.read_text().splitlines()) if r]
    uploads = [r for r in requests if r["method"] == "PUT" and "/mlflow-artifacts/" in r["path"]]
    print(
        f"bucket: {len(stored)} artifact objects, {len(ray_results)} Ray result objects; server: {len(requests)}"
        f" requests so far, {len(uploads)} artifact uploads"
    )
