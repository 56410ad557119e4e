"""What the MLflow UI shows of a sweep: the experiment's kind, the trials' run names and params, the printed URL."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from mlflow.tracking import MlflowClient

from pipeline.config import load_params
from pipeline.sweep.run import trial_run_info
from pipeline.sweep.tracking.store import EXPERIMENT_KIND, KIND_TAG, ensure_experiment
from pipeline.sweep.tracking.ui import runs_url
from stages import ui

PARAMS = Path(__file__).resolve().parents[5] / "params.yaml"


def test_the_experiment_is_a_model_training_experiment(tmp_path: Path) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    created = ensure_experiment(client, "kinds", (tmp_path / "a").as_uri())
    assert client.get_experiment(created).tags[KIND_TAG] == EXPERIMENT_KIND
    older = client.create_experiment("older", artifact_location=(tmp_path / "b").as_uri())  # made before the tag
    assert ensure_experiment(client, "older", None) == older
    assert client.get_experiment(older).tags[KIND_TAG] == EXPERIMENT_KIND
    chosen = client.create_experiment("chosen", tags={KIND_TAG: "genai_development"})
    ensure_experiment(client, "chosen", None)  # a kind set by someone else is theirs
    assert client.get_experiment(chosen).tags[KIND_TAG] == "genai_development"


def test_a_trial_logs_only_the_params_of_its_architecture() -> None:
    params = load_params(PARAMS)
    dumped = params.model_dump(mode="json")
    resnet = trial_run_info({"variant": "resnet18", "seed": 0}, dumped, "d" * 64)
    assert resnet.run_name == "resnet18 seed 0"
    model_params = {key for key in resnet.params if key.startswith("model.")}
    assert model_params == {"model.arch", "model.resnet_width"}
    assert "train.positional_lr_factor" not in resnet.params and "train.lr" in resnet.params
    learned = trial_run_info({"variant": "sa_learned_9", "seed": 2}, dumped, "d" * 64)
    assert learned.run_name == "sa_learned_9 seed 2"
    assert {"model.encoding", "model.heads", "model.learned_dim"} <= learned.params.keys()
    assert not {"model.resnet_width", "model.centre_init_std", "model.spread_init_std"} & learned.params.keys()
    quadratic = trial_run_info({"variant": "sa_quadratic_9", "seed": 0}, dumped, "d" * 64)
    assert "model.centre_init_std" in quadratic.params and "model.learned_dim" not in quadratic.params
    assert resnet.tags["trial_key"] != quadratic.tags["trial_key"]
    hooked = params.model_copy(update={"sweep": params.sweep.model_copy(update={"fail_once_after_epoch": 1})})
    logged = trial_run_info({"variant": "resnet18", "seed": 0}, hooked.model_dump(mode="json"), "d" * 64).params
    assert "sweep.max_failures" in logged and not [key for key in logged if "fail_once" in key]  # a test hook


def test_a_trial_logs_its_variant_s_train_fields_and_how_many_images_it_trains_on() -> None:
    params = load_params(PARAMS)
    dumped = params.model_dump(mode="json")
    dumped["variants"]["half"] = {"arch": "resnet18", "train.data_fraction": 0.5, "train.lr": 0.01}
    counts = (10, 7, 1)
    half = trial_run_info({"variant": "half", "seed": 0}, dumped, "d" * 64, class_counts=counts).params
    assert (half["train.data_fraction"], half["train.lr"], half["train_images"]) == ("0.5", "0.01", "10")  # 5 + 4 + 1
    whole = trial_run_info({"variant": "resnet18", "seed": 0}, dumped, "d" * 64, class_counts=counts).params
    assert (whole["train.data_fraction"], whole["train_images"]) == ("1.0", "18")


def test_the_ui_url_opens_the_sweeps_runs_in_model_training_mode_best_first() -> None:
    url = runs_url("http://127.0.0.1:5001/", "7", ["r1", "r2"], "p")
    split = urlsplit(url)
    assert f"{split.scheme}://{split.netloc}" == "http://127.0.0.1:5001"
    path, _, query = split.fragment.partition("?")
    assert path == "/experiments/7/runs"
    state = {key: values[0] for key, values in parse_qs(query).items()}
    assert state == {
        "searchFilter": "attributes.run_id IN ('r1', 'r2')",
        "orderByKey": "metrics.`test_acc`",
        "orderByAsc": "false",
        "workflowType": "machine_learning",
    }
    many = runs_url("http://h:1", "7", [f"r{i}" for i in range(500)], "p")
    assert "parentRunId" in many and "r499" not in many


def test_make_ui_prints_the_url_of_the_manifests_sweep(tmp_path: Path, capsys) -> None:
    manifest = tmp_path / "manifest.json"
    args = ["--params", str(PARAMS), "--port", "5123", "--manifest", str(manifest)]
    assert ui.main(args) == 0
    assert "http://127.0.0.1:5123/#/experiments?workflowType=machine_learning" in capsys.readouterr().out
    manifest.write_text('{"experiment_id": "3", "parent_run_id": "p", "trials": [{"run_id": "a"}, {"run_id": null}]}')
    assert ui.main(args) == 0
    out = capsys.readouterr().out
    assert "sweep's 1 trial runs: http://127.0.0.1:5123/#/experiments/3/runs?searchFilter=" in out


def test_a_sweep_on_a_tracking_server_gets_that_servers_url(tmp_path: Path, capsys) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        '{"tracking_uri": "http://127.0.0.1:9", "experiment_id": "4", "trials": [{"run_id": "a"}]}'  # not answering
    )
    assert ui.main(["--params", str(PARAMS), "--manifest", str(manifest)]) == 0
    assert "runs: http://127.0.0.1:9/#/experiments/4/runs?searchFilter=" in capsys.readouterr().out


def test_make_ui_presets_the_test_acc_column_as_the_uis_shared_view(tmp_path: Path, capsys) -> None:
    """The UI keeps its columns in the browser, except for a shared view (an experiment tag it reads from
    ``viewStateShareKey``): the printed address opens one with the sweep's filter, sort and the test_acc column."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = ensure_experiment(client, "shared", (tmp_path / "artifacts").as_uri())
    manifest = tmp_path / "manifest.json"
    trials = [{"run_id": "r1"}, {"run_id": "r2"}]
    manifest.write_text(json.dumps({"tracking_uri": uri, "experiment_id": experiment, "trials": trials}))
    assert ui.main(["--params", str(PARAMS), "--port", "5123", "--manifest", str(manifest)]) == 0
    url = capsys.readouterr().out.split("trial runs: ", 1)[1].strip()
    path, _, query = urlsplit(url).fragment.partition("?")
    state = {key: values[0] for key, values in parse_qs(query).items()}
    assert path == f"/experiments/{experiment}/runs" and state.keys() == {"viewStateShareKey", "workflowType"}
    view = json.loads(client.get_experiment(experiment).tags[f"mlflow.sharedViewState.{state['viewStateShareKey']}"])
    assert view["searchFilter"] == "attributes.run_id IN ('r1', 'r2')"
    assert view["orderByKey"] == "metrics.`test_acc`" and view["orderByAsc"] is False
    assert "metrics.`test_acc`" in view["selectedColumns"]
