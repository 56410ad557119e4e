"""`dvc repro` of prepare -> tune on the tiny profile, against a real Ray, MLflow server and DVC.

One sweep (2 variants x 1 seed, 2 epochs, every trial failing once after epoch 1) is reused by the assertions on the
MLflow run tree, the manifest, retries, the no-op re-run and the UI; later tests change params and interrupt a sweep.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
import yaml
from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.tracking.tags import MODEL_URI_TAG
from tests.project_copy import baseline_files, baseline_mismatches

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow
CHROMIUM = Path("/usr/bin/chromium")
DVC_STAGES = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())["stages"]
# The prepared digits as MLflow names them (dataset and image size of the project's params, which tiny_params keeps).
DATASET_NAME = f"digits-{load_params(Path(__file__).resolve().parents[2] / 'params.yaml').data.image_size}px"


@pytest.fixture(scope="module")
def swept(project: Project) -> dict:
    started = time.monotonic()
    done = project.dvc("repro")
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    metrics = project.dvc("metrics", "show").stdout
    results = project.path / "results"
    # The analysis' outputs as this repro left them: later tests re-run the pipeline on other variants (the tables
    # have a row per variant run, so a sweep of ResNet18 alone has no SA row).
    analysis = {
        "report": (results / "report.md").read_text(),
        "table": (results / "tables/accuracy.md").read_text(),
        "figures": sorted(p.name for p in (results / "figures").glob("*.png")),
    }
    return {
        "output": done.stdout + done.stderr,
        "manifest": manifest,
        "metrics_shown": metrics,
        "seconds": time.monotonic() - started,
        **analysis,
    }


def children(client: MlflowClient, manifest: dict) -> list:
    query = f"tags.`mlflow.parentRunId` = '{manifest['parent_run_id']}'"
    return client.search_runs([manifest["experiment_id"]], query)


def test_run_tree_in_mlflow(swept: dict, project: Project) -> None:
    manifest = swept["manifest"]
    data_hash = json.loads((project.path / "data/prepared/manifest.json").read_text())["content_sha256"]
    client = MlflowClient(manifest["tracking_uri"])
    parent = client.get_run(manifest["parent_run_id"])
    assert parent.info.status == "FINISHED"
    runs = children(client, manifest)
    assert sorted(r.info.run_name for r in runs) == ["resnet18 seed 0", "sa_quadratic_9 seed 0"]
    assert parent.info.run_name == "tune committed params"  # the project copy's params are its commit's
    # Every run this sweep ever made (other tests add sweeps to the experiment, in any order):
    everything = client.search_runs([manifest["experiment_id"]], f"tags.params_hash = '{manifest['params_hash']}'")
    assert len(everything) == 3  # no duplicate run although every trial failed once and was retried
    assert not [r for r in everything if r.info.status == "RUNNING"]
    for run in runs:
        tags = run.data.tags
        for key in (
            "ray.trial_id",
            "git_commit",
            "dvc_stage",
            "params_hash",
            "variant",
            "seed",
            "ray.node_id",
            "device_name",
        ):
            assert tags.get(key), key
        assert tags["tune.retries"] == "1" and tags["tune.status"] == "finished"
        # Sampled in the Ray worker by MLflow's own monitor, with the hardware as tags:
        assert tags["host.cpu"] and tags["torch.version"] and tags["host.memory_gb"]
        assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= run.data.metrics.keys()
        assert run.data.params["train.epochs"] == "2"
        if tags["variant"] == "resnet18":  # only the params of its architecture: no encoding, heads, attention
            assert {k for k in run.data.params if k.startswith("model.")} == {"model.arch", "model.resnet_width"}
        else:
            assert run.data.params["model.hidden"] == "16" and run.data.params["model.encoding"] == "quadratic"
        locality = [key for key in run.data.metrics if key.startswith("locality/")]  # every layer, every metric
        assert len(locality) == (3 if tags["variant"] == "sa_quadratic_9" else 0), locality  # 1 layer x 3 metrics
        for key in ("test_acc", "train_loss", "images_per_s", *locality):
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            expected = [0, 1, 2] if key in locality else [1, 2]  # locality from step 0: before training
            assert steps == expected, (key, steps)  # the retry continued at epoch 2, nothing logged twice
        artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")]
        assert "checkpoint/checkpoint.pt" in artifacts
        if tags["variant"] == "sa_quadratic_9":
            assert {"checkpoint/head_history.json", "checkpoint/locality_history.json"} <= set(artifacts)
        assert tags["mlflow.source.git.commit"] == parent.data.tags["mlflow.source.git.commit"]  # MLflow's context
        assert tags["mlflow.user"] and tags["mlflow.source.name"].endswith("stages/tune.py")
        (dataset,) = run.inputs.dataset_inputs  # the prepared data, by its content hash
        assert dataset.dataset.name == DATASET_NAME and dataset.dataset.digest == data_hash[:12]
        # One seed per variant: each trial is its variant's best, its model logged when registered.
        model = client.get_logged_model(tags[MODEL_URI_TAG].removeprefix("models:/"))
        assert model.source_run_id == run.info.run_id
    # The parent row: per-variant final accuracy (as in metrics.json), a description, the best model registered.
    # (read from this sweep's manifest: other tests, in any order, rewrite the project's metrics.json)
    final = {t["variant"]: t["metrics"]["test_acc"] for t in manifest["trials"]}  # one seed: the mean is its value
    assert parent.data.metrics == {f"test_acc.{v}": final[v] for v in ("resnet18", "sa_quadratic_9")}
    assert parent.data.tags["mlflow.note.content"].startswith("**Sweep of 2 variants x 1 seed**, 2 epochs each, on")
    for run in runs:
        versions = client.search_model_versions(f"name = 'it-sweep.{run.data.tags['variant']}'")
        assert run.info.run_id in {v.run_id for v in versions}


def test_manifest_for_later_stages(swept: dict, project: Project) -> None:
    manifest = swept["manifest"]
    assert manifest["tracking_uri"].startswith("http://127.0.0.1:")
    assert {t["variant"] for t in manifest["trials"]} == {"sa_quadratic_9", "resnet18"}
    for trial in manifest["trials"]:
        assert trial["run_id"] and trial["seed"] == 0 and trial["status"] == "finished"
        assert trial["epochs_completed"] == 2 and 0.0 <= trial["metrics"]["test_acc"] <= 1.0
        checkpoint = Path(trial["checkpoint_dir"])  # inside the project: relative to it
        assert not checkpoint.is_absolute() and (project.path / checkpoint / "checkpoint.pt").is_file()
        if trial["variant"] == "sa_quadratic_9":
            history = json.loads((project.path / trial["head_history"]).read_text())
            assert [h["epoch"] for h in history] == [0, 1, 2]
    assert "sa_quadratic_9" in swept["metrics_shown"] and "test_acc" in swept["metrics_shown"]


# Lines the tune stage of this module's `dvc repro` printed to stdout (Ray's progress output; logs and tracebacks
# go to stderr) on main before the progress reporter: Ray's default engine printed, per trial, its config and a
# table of every reported value (7 `trial_tags/...` rows each), and status tables without test_acc. Measured with a
# local Ray and sqlite store on this module's profile.
TUNE_LINES_BEFORE = 235


def test_progress_output_reads_at_a_glance(swept: dict, tmp_path: Path) -> None:
    stdout = swept["output"].splitlines()  # stdout, then stderr: dvc's stage headers and Ray's tables are on stdout
    tune = stdout[stdout.index("Running stage 'tune':") : stdout.index("Running stage 'prune':")]
    (tmp_path / "tune_stdout.txt").write_text("\n".join(tune))
    headers = [line for line in tune if line.startswith("| trial ") and "status" in line]
    assert headers, "\n".join(tune)
    for column in ("variant", "seed", "epoch", "train_loss", "test_acc", "images/s", "time (s)", "ETA (s)"):
        assert all(column in header for header in headers), column
    assert "trial_tags" not in swept["output"] and "fail_once_after_epoch" not in "\n".join(tune)
    assert len(tune) <= TUNE_LINES_BEFORE // 3, "\n".join(tune)


def test_mlflow_ui_shows_the_sweep(swept: dict, project: Project, tmp_path: Path) -> None:
    """The runs table, the page `make ui` prints (the trials in model-training mode, best test_acc first, with the
    test_acc column), the parent's run page (summary metrics, description), a child's run page (its dataset and
    model) and the registered model's page, rendered by the real MLflow UI in headless Chromium; the screenshots
    stay in tmp_path. Each page opens in a fresh browser profile, as a colleague's link would: the experiments list
    (in the home page's order, newest first) has the study's experiment before its internal claims, and the
    experiment's plain address (MLflow's GenAI mode, the default of a browser that never flipped the switch) offers
    the trials as "Training runs"."""
    if not CHROMIUM.exists():
        pytest.skip("headless Chromium not installed (/usr/bin/chromium; apt-get install chromium)")
    manifest = swept["manifest"]
    client = MlflowClient(manifest["tracking_uri"])
    child = next(run for run in children(client, manifest) if run.data.tags["variant"] == "resnet18")
    parent = client.get_run(manifest["parent_run_id"])
    experiment = f"{manifest['tracking_uri']}/#/experiments/{manifest['experiment_id']}"
    server = urlsplit(manifest["tracking_uri"])
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))  # this sweep's (later tests re-run the stage)
    ui = ["python", "-m", "stages.ui", "--manifest", str(tmp_path / "manifest.json")]
    printed = project.run(*ui, "--host", server.hostname, "--port", str(server.port)).stdout
    pages = {
        "runs": f"{experiment}/runs",
        "sweep": printed.split(": ", 1)[1].strip(),
        "parent": f"{experiment}/runs/{parent.info.run_id}",
        "child": f"{experiment}/runs/{child.info.run_id}",
        "registered_model": f"{manifest['tracking_uri']}/#/models/it-sweep.resnet18",
        "experiments": f"{manifest['tracking_uri']}/#/experiments",  # the home page's 5 most recent, 25 to a page
        "experiment": experiment,
    }
    dom = {}
    for name, url in pages.items():
        profile = tempfile.mkdtemp(dir=tmp_path)
        command = [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            "--window-size=2400,1000",
        ]
        # One browser per page: the screenshot (for a person) and the DOM (for the assertions) of the same load.
        shot = [f"--screenshot={tmp_path / name}.png", "--dump-dom", url]
        dumped = subprocess.run([*command, *shot], capture_output=True, text=True, timeout=120)
        assert dumped.returncode == 0 and (tmp_path / f"{name}.png").is_file(), dumped.stderr[-2000:]
        dom[name] = dumped.stdout
        (tmp_path / f"{name}.html").write_text(dumped.stdout)
    assert parent.info.run_name in dom["runs"]  # the table renders only the metric columns in view
    trials = sorted(children(client, manifest), key=lambda run: -run.data.metrics["test_acc"])
    shown = [dom["sweep"].find(f">{run.info.run_name}<") for run in trials]
    assert -1 not in shown and shown == sorted(shown), shown  # the trials, best test_acc first
    assert f">{parent.info.run_name}<" not in dom["sweep"] and "Sort: test_acc" in dom["sweep"]
    assert 'data-testid="sort-header-test_acc"' in dom["sweep"]  # the column, from the shared view stages.ui wrote
    assert 'data-testid="sort-header-test_acc"' not in dom["runs"]  # which the plain runs page does not show
    assert "Agent versions" not in dom["sweep"] and "Evaluation runs" not in dom["sweep"]  # not the GenAI mode
    assert "test_acc.resnet18" in dom["parent"] and "Sweep of 2 variants x 1 seed" in dom["parent"]
    assert child.info.run_name in dom["child"] and DATASET_NAME in dom["child"]  # the dataset it trained on
    assert child.data.tags[MODEL_URI_TAG].removeprefix("models:/") in dom["child"]  # its logged model
    assert "it-sweep.resnet18" in dom["registered_model"] and "Version" in dom["registered_model"]
    assert "@&nbsp;best<" in dom["registered_model"]  # the alias on the best version
    study = client.get_experiment(manifest["experiment_id"]).name
    listed = [dom["experiments"].find(f">{name}</a>") for name in (study, f"{study}.claims")]
    assert -1 not in listed and listed == sorted(listed), listed  # the study first, then its claims
    assert ">Training runs<" in dom["experiment"]  # GenAI mode's entry: registered trials log models


def test_a_run_compares_against_the_committed_baseline_and_a_second_does_nothing(swept: dict, project: Project) -> None:
    """The project commits the default's reference (``make baseline``'s files), and the test project's commit carries
    them but the lock (the copy leaves out the repository's dvc.lock, a run of other params): with those git-tracked
    ``cache: false`` outputs DVC runs every stage, a run changes no other tracked file, and ``dvc metrics diff`` /
    ``dvc exp show`` compare it against the reference. A second ``dvc repro`` then runs nothing, and the dry run says
    every trial would reuse its run."""
    project.dvc("repro")  # brings the project up to date whatever ran before (a restore: nothing retrains)
    assert yaml.safe_load((project.path / "dvc.lock").read_text())["stages"].keys() == DVC_STAGES.keys()  # all ran
    reference = set(baseline_files())
    committed = set(project.run("git", "ls-files", "--", *reference).stdout.split())
    assert committed == reference - {"dvc.lock"}
    changed = project.run("git", "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    assert {line[3:] for line in changed} <= reference and " M results/tune/test_acc.json" in changed, changed

    diff = json.loads(project.dvc("metrics", "diff", "--json").stdout)  # HEAD (the reference) vs the workspace
    for variant in ("sa_quadratic_9", "resnet18"):
        entry = diff["results/tune/test_acc.json"][variant]
        assert isinstance(entry["old"], float) and isinstance(entry["new"], float), entry
        assert entry["new"] == json.loads((project.path / "results/tune/metrics.json").read_text())[variant]["test_acc"]
    shown = list(csv.DictReader(io.StringIO(project.dvc("exp", "show", "--csv").stdout)))
    baseline = next(row for row in shown if row["typ"] == "baseline" and row["rev"] != "workspace")  # HEAD
    assert float(baseline["resnet18"]) == diff["results/tune/test_acc.json"]["resnet18"]["old"]

    done = project.dvc("repro")
    output = done.stdout + done.stderr
    assert "didn't change" in output or "up to date" in output
    assert "Running stage" not in output
    dry = project.run("python", "-m", "stages.tune", "--dry-run").stdout
    assert "finished: nothing to train" in dry and "RESTORE" not in dry  # not "the interrupted sweep"
    for trial in swept["manifest"]["trials"]:
        assert f"{trial['variant']:<20} {trial['seed']:>4}" in dry
    rows = {f"{t['variant']:<20} {t['seed']:>4}": t["run_id"] for t in swept["manifest"]["trials"]}
    for line in dry.splitlines():  # a finished sweep: each trial would reuse its own run, none trains
        assert not line.startswith(tuple(rows)) or line.endswith(f"reuse run {rows[line[:25]]}"), line

    # One truth: run anyway (as `dvc repro --force` does), and the log and the manifest say what the plan said.
    manifest_file = project.path / "results/tune/manifest.json"
    kept = manifest_file.read_text()  # the shared project's manifest goes back as it was (its trials say "trained")
    try:
        rerun = project.run("python", "-m", "stages.tune")
        again = json.loads(manifest_file.read_text())
    finally:
        manifest_file.write_text(kept)
    log = rerun.stdout + rerun.stderr
    assert "restoring the interrupted sweep" not in log, log[-3000:]
    assert f"0 trial(s) trained or resumed, {len(rows)} reused" in log, log[-3000:]
    for trial in swept["manifest"]["trials"]:
        assert f"{trial['variant']} seed {trial['seed']}: reuse run {trial['run_id']}" in log, log[-3000:]
    assert all(t["reused"] for t in again["trials"])
    assert [(t["variant"], t["run_id"]) for t in again["trials"]] == [
        (t["variant"], t["run_id"]) for t in swept["manifest"]["trials"]
    ]


def test_dvc_exp_run_reruns_only_tune_and_names_its_mlflow_runs(
    swept: dict, project: Project, project_params: dict
) -> None:
    """A changed sweep param reruns the tune stage, not prepare (DVC tracks each stage's params); DVC sets
    DVC_EXP_NAME for the stages of `dvc exp run`, and the sweep's runs carry it as `dvc.exp_name`."""
    changes = ["train.epochs=1", "sweep.variants=[resnet18]", "sweep.fail_once_after_epoch=null"]
    set_params = (arg for c in changes for arg in ("--set-param", c))
    done = project.dvc("exp", "run", "tune", "--name", "habits-exp", *set_params)
    assert "Stage 'prepare' didn't change" in done.stdout and "Running stage 'tune'" in done.stdout, done.stdout
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    assert [t["variant"] for t in manifest["trials"]] == ["resnet18"]
    assert manifest["parent_run_id"] != swept["manifest"]["parent_run_id"]
    assert "sweep.variants" in project.dvc("params", "diff").stdout
    client = MlflowClient(manifest["tracking_uri"])
    runs = [client.get_run(manifest["parent_run_id"]), *children(client, manifest)]
    assert len(runs) == 2 and {run.data.tags.get("dvc.exp_name") for run in runs} == {"habits-exp"}
    shown = project.dvc("exp", "show", "--csv", "--only-changed").stdout
    assert "habits-exp" in shown
    # One column per variant's accuracy, named after it: no accuracy repeated under another name across the metrics.
    header = next(csv.reader(io.StringIO(shown)))
    assert "resnet18" in header and not [name for name in header if "test_acc" in name or "acc_after" in name], header


def test_interrupted_sweep_restores(swept: dict, project: Project, project_params: dict) -> None:
    """Ctrl-C (SIGINT) on `dvc repro`; SIGTERM (a scheduler preempting the job) takes the same path, and its restore
    is test_truncated_checkpoint.py's."""
    params = project_params  # swept: data/prepared exists
    epochs = 12
    params["train"]["epochs"] = epochs
    # Both trials at once, so both are mid-training when the stage stops (one at a time leaves one pending).
    params["sweep"].update(fail_once_after_epoch=None, max_concurrent_trials=2)
    project.write_params(params)
    tiny = load_params(project.path / "params.yaml")
    path = project.path / "results/ray" / experiment_name(tiny, prepared_data_hash(tiny, project.path))
    returncode, output = project.interrupt_tune(path, 1)
    assert returncode == 130, output[-3000:]
    record = json.loads((path / "mlflow_parent_run.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    before = {r.info.run_id: r for r in children(client, record)}
    assert client.get_run(record["parent_run_id"]).info.status == "KILLED"
    assert before and all(r.info.status == "KILLED" for r in before.values())
    dry = project.run("python", "-m", "stages.tune", "--dry-run").stdout  # what the restore below will do
    plans = [line for line in dry.splitlines() if line.startswith(("sa_quadratic_9 ", "resnet18 "))]
    assert len(plans) == 2 and "interrupted: would restore it" in dry, dry
    assert not [line for line in plans if line.endswith(" train")], dry  # none would train from scratch
    resumed = [line for line in plans if "restore: resume after epoch" in line]
    assert resumed and all(("restore: " in line) or line.split("  ")[-1].startswith("reuse") for line in plans), dry

    second = project.run("python", "-m", "stages.tune")
    assert "restoring the interrupted sweep" in second.stderr
    after = {r.info.run_id: r for r in children(client, record)}
    assert after.keys() == before.keys()  # the same runs continued, no duplicates
    for run in after.values():
        assert run.info.status == "FINISHED"
        locality = ["locality/layer1/mean_distance"] if run.data.tags["variant"] == "sa_quadratic_9" else []
        for key in ("test_acc", *locality):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            first = 0 if key in locality else 1  # locality from step 0: before training
            assert sorted(steps) == list(range(first, epochs + 1)), (key, steps)  # each epoch logged once
    assert client.get_run(record["parent_run_id"]).info.status == "FINISHED"


def test_asha_stops_weak_trials_early_and_says_so(swept: dict, project: Project, project_params: dict) -> None:
    """ASHA (grace 1, halving) over the five variants, one at a time so its decisions do not depend on timing."""
    params = project_params
    params["train"]["epochs"] = 4
    params["sweep"].update(
        variants=["sa_quadratic_9", "sa_quadratic_16", "sa_generalized_9", "sa_learned_9", "resnet18"],
        max_concurrent_trials=1,
        fail_once_after_epoch=None,
        asha={"enabled": True, "grace_period": 1, "reduction_factor": 2},
    )
    project.write_params(params)
    project.run("python", "-m", "stages.tune")
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    client = MlflowClient(manifest["tracking_uri"])
    runs = {r.info.run_id: r for r in children(client, manifest)}
    by_status: dict[str, list[dict]] = {}
    for trial in manifest["trials"]:
        by_status.setdefault(trial["status"], []).append(trial)
        run = runs[trial["run_id"]]
        assert run.info.status == "FINISHED"  # stopped early is a normal end, not a failure
        assert run.data.tags["tune.status"] == trial["status"]  # one decision, seen the same in both places
        steps = [m.step for m in client.get_metric_history(trial["run_id"], "test_acc")]
        assert steps == list(range(1, trial["epochs_completed"] + 1))
        assert (project.path / trial["checkpoint_dir"] / "checkpoint.pt").is_file()
    assert set(by_status) <= {"finished", "early_stopped"}
    assert by_status.get("early_stopped"), "ASHA stopped no trial"  # halving at epochs 1 and 2 over 5 trials
    assert all(t["epochs_completed"] == 4 for t in by_status.get("finished", []))
    for trial in by_status["early_stopped"]:
        assert trial["epochs_completed"] in (1, 2)  # ASHA's rungs
        assert runs[trial["run_id"]].data.tags["tune.early_stopped"] == "true"
    metrics = json.loads((project.path / "results/tune/metrics.json").read_text())
    assert set(metrics) == {t["variant"] for t in manifest["trials"]}


def test_a_trial_larger_than_the_running_ray_is_refused(ray_address: str, tmp_path: Path) -> None:
    from pipeline.config import parse_params
    from pipeline.sweep.preflight import preflight

    raw = load_params(Path(__file__).resolve().parents[2] / "params.yaml").model_dump(mode="json")
    raw["sweep"]["resources"] = {"cpu": 3, "gpu": 0}  # the session's Ray has 2 CPUs
    with pytest.raises(ValueError, match="sweep.resources.cpu: each trial asks for 3 CPUs, the running Ray has 2"):
        preflight(parse_params(raw), tmp_path)


def test_local_ray_talks_over_loopback_only(ray_address: str) -> None:
    import ray

    assert ray_address.startswith("127.0.0.1:")
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}


def test_repro_ends_with_the_report(swept: dict, project: Project, tmp_path: Path) -> None:
    """The whole pipeline ran: the analysis stage wrote the report, the table, the figures and DVC's plots."""
    report = swept["report"]
    assert (
        report.startswith("Setting: dataset: digits") and "smaller than the paper's setting" in report.splitlines()[0]
    )
    table = swept["table"]
    assert "SA quadratic" in table and "ResNet18" in table
    figures = swept["figures"]
    assert "fig4_accuracy.png" in figures and "theorem1_error_vs_alpha.png" in figures
    assert all(f"figures/{name}" in report for name in figures)
    assert "Running stage 'analyze'" in swept["output"] and "Running stage 'prune'" in swept["output"]
    html = project.dvc("plots", "show", "-o", str(tmp_path / "plots"))
    assert (tmp_path / "plots/index.html").is_file(), html.stdout


def test_no_secret_is_logged_as_a_param_or_tag(swept: dict) -> None:
    """Every run of the smoke pipeline (sweep, prune, analysis): no Ray auth token, credential or token-like value in
    its params or tags (the MLflow UI shows them to anyone who can read the store)."""
    secrets = {
        os.environ.get(name, "") for name in ("RAY_AUTH_TOKEN", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD")
    }
    token_file = Path.home() / ".ray/auth_token"  # written by the session's local Ray (token auth on)
    secrets |= {token_file.read_text().strip()} if token_file.is_file() else set()
    secrets.discard("")
    suspicious = re.compile(r"(?i)(token|secret|password|bearer|authorization|api[_-]?key)|://[^/\s:@]+:[^/\s@]+@")
    manifest = swept["manifest"]
    client = MlflowClient(manifest["tracking_uri"])
    runs = client.search_runs([manifest["experiment_id"]])
    assert len(runs) >= 4  # parent, 2 trials, and the prune / analysis runs of the smoke pipeline
    found = [
        f"{run.info.run_name}: {key}={value[:40]}"
        for run in runs
        for key, value in {**run.data.params, **run.data.tags}.items()
        if any(secret in value for secret in secrets) or suspicious.search(key) or suspicious.search(value)
    ]
    assert not found, found


def test_the_local_ray_has_token_auth_on(ray_address: str) -> None:
    """A new local Ray turns token authentication on (nothing here switches it off): a client needs the token."""
    from ray._raylet import AuthenticationMode, get_authentication_mode  # Ray exposes the mode only here

    assert get_authentication_mode() == AuthenticationMode.TOKEN
    assert (Path.home() / ".ray/auth_token").is_file()


SCREEN = 120  # a terminal's columns
NUMBER = re.compile(r"[01]\.\d+")  # an accuracy as dvc exp show prints it


def test_dvc_exp_show_compares_an_experiment_on_one_screen(swept: dict, project: Project) -> None:
    """After ``make baseline`` (its files committed) and one ``dvc exp run -S train.epochs=1`` (and an lr), what a
    user at a 120-column terminal sees: ``dvc exp show`` pages through ``less --chop-long-lines`` (DVC's default
    pager: each line's first 120 characters on screen, the rest a scroll away); its first screen shows the
    experiment rows and every variant's accuracy whole, with ``--only-changed`` the changed params too, and that
    one's CSV has at most 25 columns: the lock makes unchanged dependencies compare equal. (Not ``--no-pager``: DVC
    squeezes a table of ~100 columns, every param of params.yaml and every dependency, into a strip of "…" cells;
    docs/running.md.)"""
    project.run("git", "checkout", "--", "params.yaml")  # the committed profile, whatever an earlier experiment left
    project.dvc("repro")  # its outputs (a restore: nothing retrains)
    project.run("git", "add", *baseline_files())  # what `make baseline` stages
    project.run("git", "commit", "-q", "-m", "baseline")
    try:
        mismatches = baseline_mismatches(project.path)  # as tests/unit/test_baseline.py wants the repository's
        assert not mismatches, "\n".join(mismatches)
        # An lr of its own: trial identities no other test trains (a run of theirs would be reused, or this by them).
        project.dvc("exp", "run", "--name", "epochs1", "--set-param", "train.epochs=1", "--set-param", "train.lr=0.08")
        _one_screen_after_an_experiment(project)
    finally:  # the shared project as the other tests find it, in whatever order they run: no lock committed
        project.run("git", "reset", "-q", "HEAD~1")
        project.run("git", "checkout", "--", "params.yaml")


def _one_screen_after_an_experiment(project: Project) -> None:
    results = project.path / "results"
    variants = [
        name
        for stage in ("tune", "prune", "transform")
        for name in json.loads((results / stage / "test_acc.json").read_text())
    ]
    assert {"resnet18", "sa_quadratic_9", "t_resnet18"} <= set(variants), variants
    paged = _exp_show(project)
    _on_screen(paged, variants, variants)
    changed = _exp_show(project, "--only-changed")
    _on_screen(changed, [*variants, "train.epochs", "train.lr"], variants)
    columns = next(csv.reader(io.StringIO(_exp_show(project, "--only-changed", "--csv"))))
    assert len(columns) <= 25 and {"Experiment", "train.epochs", "train.lr", *variants} <= set(columns), columns
    manifests = {f"results/{stage}/manifest.json" for stage in ("tune", "prune", "transform")}
    assert {name for name in columns if "/" in name} <= manifests, columns  # code and data: equal to the baseline's
    widths = {name: max(map(len, table.splitlines())) for name, table in (("plain", paged), ("changed", changed))}
    print(
        f"dvc exp show: {widths['plain']} characters wide plain, {widths['changed']} with --only-changed "
        f"({len(columns)} CSV columns)"
    )


def _exp_show(project: Project, *args: str) -> str:
    """``dvc exp show`` as on a ``SCREEN``-column terminal (its pager left to DVC: none when not a terminal)."""
    env = {**project.env, "COLUMNS": str(SCREEN)}
    command = ["dvc", "exp", "show", *args]
    return subprocess.run(command, cwd=project.path, env=env, capture_output=True, text=True, check=True).stdout


def _on_screen(table: str, columns: list[str], numbers: list[str]) -> None:
    """The table's first screen holds every name of ``columns`` whole in its header, its three rows, and a number in
    the experiment's row under each name of ``numbers`` (a cell is no wider than its header: names are)."""
    screen = [line[:SCREEN] for line in table.splitlines()]
    assert not [line for line in screen if "…" in line], table  # no column collapsed or cut on screen
    at = next(i for i, line in enumerate(screen) if "Experiment" in line)
    spans = {}
    for name in columns:
        found = re.search(rf"(?<!\S){re.escape(name)}(?!\S)", screen[at])
        assert found, (name, screen[at])
        spans[name] = found.span()
    rows = [line for line in screen[at + 1 :] if line.strip() and set(line.strip()) != {"─"}]
    assert len(rows) == 3 and "workspace" in rows[0], screen  # the workspace, the baseline and the experiment
    experiment = next(line for line in rows if "[epochs1]" in line)
    for name in numbers:
        start, end = spans[name]
        assert NUMBER.fullmatch(experiment[start:end].strip()), (name, experiment)
