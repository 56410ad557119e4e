"""Growing a sweep trains only its new trials: real Ray, a real MLflow server, the tune stage as users run it.

Each test uses its own ``train.lr`` so its trial identities are its own, whatever other tests ran before.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def prepared(project: Project) -> None:
    project.dvc("repro", "prepare")


def tune(project: Project, params: dict) -> dict:
    """Run the tune stage on ``params``; what it trained (runs and epochs) and its manifest."""
    project.write_params(params)
    started = time.monotonic()
    project.run("python", "-m", "stages.tune")
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    client = MlflowClient(manifest["tracking_uri"])
    parent = client.get_run(manifest["parent_run_id"])
    with tempfile.TemporaryDirectory() as tmp:
        listed = json.loads(Path(client.download_artifacts(parent.info.run_id, "sweep_trials.json", tmp)).read_text())
    trained = [t for t in manifest["trials"] if not t["reused"]]
    return {
        "manifest": manifest,
        "client": client,
        "parent": parent,
        "listed": listed["trials"],
        "seconds": time.monotonic() - started,
        "trained": sorted((t["variant"], t["seed"]) for t in trained),
        "reused": sorted((t["variant"], t["seed"]) for t in manifest["trials"] if t["reused"]),
        # epochs each trial of this stage run logged: the parent starting them (or a resumed run's new steps)
        "epochs": {
            (t["variant"], t["seed"]): [m.step for m in client.get_metric_history(t["run_id"], "test_acc")]
            for t in trained
        },
    }


def runs_per_key(client: MlflowClient, manifest: dict) -> dict[str, int]:
    counts = {}
    for trial in manifest["trials"]:
        found = client.search_runs([manifest["experiment_id"]], f"tags.trial_key = '{trial['trial_key']}'")
        counts[trial["trial_key"]] = len(found)
    return counts


def test_adding_seeds_and_variants_trains_only_the_new_trials(project: Project, project_params: dict) -> None:
    params = project_params
    params["train"].update(lr=0.07, epochs=2)
    params["sweep"].update(variants=["sa_quadratic_9", "resnet18"], seeds=[0], fail_once_after_epoch=None)
    first = tune(project, params)
    assert first["trained"] == [("resnet18", 0), ("sa_quadratic_9", 0)] and first["reused"] == []
    for trial in first["manifest"]["trials"]:  # tracking.system_metrics is off here (project_params): none sampled
        run = first["client"].get_run(trial["run_id"])
        assert not [key for key in run.data.metrics if key.startswith("system/")] and "host.cpu" not in run.data.tags

    params["sweep"]["seeds"] = [0, 1]
    second = tune(project, params)
    assert second["trained"] == [("resnet18", 1), ("sa_quadratic_9", 1)]
    assert second["reused"] == [("resnet18", 0), ("sa_quadratic_9", 0)]
    assert all(steps == [1, 2] for steps in second["epochs"].values())  # 2 trials x 2 epochs trained, no more
    assert second["parent"].data.tags["tune.trials_trained"] == "2"
    assert second["parent"].data.tags["tune.trials_reused"] == "2"
    first_runs = {(t["variant"], t["seed"]): t["run_id"] for t in first["manifest"]["trials"]}
    for trial in second["manifest"]["trials"]:
        if trial["reused"]:  # the first sweep's run, listed with the parent that trained it
            assert trial["run_id"] == first_runs[(trial["variant"], trial["seed"])]
            assert trial["sweep_run_id"] == first["manifest"]["parent_run_id"]
            assert trial["status"] == "finished" and trial["epochs_completed"] == 2 and trial["checkpoint_dir"]
    assert {t["action"] for t in second["listed"]} == {"reuse", "train"} and len(second["listed"]) == 4
    assert set(runs_per_key(second["client"], second["manifest"]).values()) == {1}  # one run per trial identity

    params["sweep"]["variants"] = ["sa_quadratic_9", "resnet18", "sa_learned_9"]
    third = tune(project, params)
    assert third["trained"] == [("sa_learned_9", 0), ("sa_learned_9", 1)] and len(third["reused"]) == 4
    assert set(runs_per_key(third["client"], third["manifest"]).values()) == {1}
    metrics = json.loads((project.path / "results/tune/metrics.json").read_text())
    assert metrics["resnet18"]["test_acc_n"] == 2 and metrics["sa_learned_9"]["test_acc_n"] == 2

    shutil.rmtree(project.path / third["manifest"]["ray_experiment_path"])  # Ray results gone: runs still reused
    again = tune(project, params)
    assert again["trained"] == [] and len(again["reused"]) == 6
    assert again["parent"].data.tags["tune.trials_trained"] == "0"

    params["train"]["lr"] = 0.06  # a value every trial depends on: all retrain (the plan the stage would run)
    project.write_params(params)
    dry = project.run("python", "-m", "stages.tune", "--dry-run").stdout
    plans = [line for line in dry.splitlines() if line.startswith(tuple(f"{v} " for v in params["sweep"]["variants"]))]
    assert len(plans) == 6 and all(line.endswith(" train") for line in plans), dry


def test_a_killed_trial_resumes_when_the_sweep_grows(project: Project, project_params: dict) -> None:
    params = project_params
    params["train"].update(lr=0.03, epochs=8)
    params["sweep"].update(variants=["sa_quadratic_9"], seeds=[0], fail_once_after_epoch=None)
    project.write_params(params)
    tiny = load_params(project.path / "params.yaml")
    path = project.path / "results/ray" / experiment_name(tiny, prepared_data_hash(tiny, project.path))
    returncode, output = project.interrupt_tune(path, 2)
    assert returncode == 130, output[-3000:]
    client = MlflowClient(params["tracking"]["uri"])
    experiment = client.get_experiment_by_name(params["tracking"]["experiment"]).experiment_id
    killed = client.search_runs([experiment], f"tags.params_hash = '{path.name.removeprefix('tune-')}'")
    killed = [r for r in killed if r.data.tags.get("sweep.role") != "parent"]
    assert len(killed) == 1 and killed[0].info.status == "KILLED"

    params["sweep"]["seeds"] = [0, 1]  # a new sweep: the killed trial is not restored by Tune, it is resumed
    grown = tune(project, params)
    by_seed = {t["seed"]: t for t in grown["manifest"]["trials"]}
    assert by_seed[0]["run_id"] == killed[0].info.run_id  # the same run continued: one run per trial identity
    assert grown["epochs"][("sa_quadratic_9", 0)] == list(range(1, 9))  # every epoch once, none lost or repeated
    assert grown["epochs"][("sa_quadratic_9", 1)] == list(range(1, 9))
    assert by_seed[0]["status"] == "finished" and client.get_run(by_seed[0]["run_id"]).info.status == "FINISHED"
    resumed = next(t for t in grown["listed"] if t["seed"] == 0)
    assert resumed["action"] == "resume" and resumed["epoch"] >= 3  # checkpoint_000002 existed
    assert set(runs_per_key(client, grown["manifest"]).values()) == {1}
