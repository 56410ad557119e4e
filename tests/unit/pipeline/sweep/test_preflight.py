"""What the tune stage checks before Ray starts or an MLflow run exists: each problem fails fast, naming its key."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.config import load_params, parse_params
from pipeline.sweep.preflight import preflight
from stages import tune as tune_stage

ROOT = Path(__file__).resolve().parents[4]


def _raw() -> dict:
    return load_params(ROOT / "params.yaml").model_dump(mode="json")


def _params(**sweep_and_tracking):
    raw = _raw()
    raw["sweep"].update(sweep_and_tracking.pop("sweep", {}))
    raw["tracking"].update(sweep_and_tracking.pop("tracking", {}))
    return parse_params(raw, "test params")


@pytest.fixture(autouse=True)
def no_ray_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a stage's own process; the integration tests' session Ray would otherwise be the one judged."""
    monkeypatch.setattr("pipeline.sweep.preflight.ray.is_initialized", lambda: False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_local_ray_without_the_gpus_a_trial_asks_for_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"sweep.resources.gpu: each trial asks for 1 GPU\(s\), .* has 0"):
        preflight(_params(sweep={"resources": {"cpu": 1, "gpu": 1}}), tmp_path)


def test_more_cores_than_the_machine_has_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sweep.resources.cpu: each trial asks for 4096 CPUs"):
        preflight(_params(sweep={"resources": {"cpu": 4096, "gpu": 0}}), tmp_path)


def test_a_cluster_is_not_judged_by_this_machine(tmp_path: Path) -> None:
    params = _params(sweep={"resources": {"cpu": 4096, "gpu": 8}, "ray_address": f"127.0.0.1:{_closed_port()}"})
    # the cluster (or its autoscaler) decides on resources; what is checked is that it can be attached to at all
    with pytest.raises(ValueError, match=r"^sweep.ray_address: cannot attach to the Ray cluster at 127.0.0.1:\d+ \("):
        preflight(params, tmp_path)


def test_storage_that_cannot_hold_the_ray_results_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results").write_text("a file where a folder should be\n")
    with pytest.raises(ValueError, match="sweep.storage_path: .*results exists and is not a directory"):
        preflight(_params(sweep={"storage_path": "results/ray"}), tmp_path)
    assert not (tmp_path / "mlflow.db").exists()  # refused before the tracking store was touched


def test_storage_on_a_file_system_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sweep.storage_path: cannot write in /proc"):
        preflight(_params(sweep={"storage_path": "/proc/ray"}), tmp_path)


def test_a_malformed_tracking_url_is_refused_without_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tracking.uri: no MLflow server answers"):
        preflight(_params(tracking={"uri": f"http://127.0.0.1:{_closed_port()}/ x"}), tmp_path)


def test_a_tracking_server_that_does_not_answer_is_refused_in_seconds(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(ValueError, match=f"tracking.uri: no MLflow server answers at {uri}/health"):
        preflight(_params(tracking={"uri": uri}), tmp_path)
    assert time.monotonic() - started < 10  # MLflow's own client would retry for minutes


def test_the_dry_run_reports_the_problem_and_exits_2(tmp_path: Path, monkeypatch, caplog, capsys) -> None:
    raw = _raw()
    raw["sweep"]["resources"] = {"cpu": 4096, "gpu": 0}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with caplog.at_level(logging.ERROR):
        assert tune_stage.main(["--dry-run"]) == 2
    assert "variant" in capsys.readouterr().out  # the plan is still shown
    assert "sweep.resources.cpu" in caplog.text


def test_the_dry_run_says_when_the_prepared_data_is_not_what_params_ask_for(tmp_path: Path) -> None:
    """The paper's params over the smoke profile's digits: the dry run says the data is stale (and what fixes it)."""
    from pipeline.sweep.dry_run import stale_data

    prepared = tmp_path / "data/prepared"
    prepared.mkdir(parents=True)
    size = _params().data.image_size
    manifest = {"dataset": "digits", "image_shape": [3, size, size], "test_fraction": 0.2}
    (prepared / "manifest.json").write_text(json.dumps(manifest))
    assert stale_data(_params(), tmp_path) == []  # the smoke profile's own data
    paper = load_params(ROOT / "params/paper.yaml")
    stale = stale_data(paper, tmp_path)
    assert "data.dataset is 'cifar10' but the prepared data has 'digits'" in stale
    assert f"data.image_size is 32 but the prepared data has {size}" in stale


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("train", "epochs", 1000000000000), ("model", "layers", 1000000000), ("train", "lr", 1e308)],
)
def test_absurd_values_are_refused_by_the_dry_run_naming_the_key(
    section: str, key: str, value: float, tmp_path: Path, monkeypatch, caplog, capsys
) -> None:
    """Issue 29's probe: these passed validation and the dry run (exit 0); now exit 2 on loading, before Ray."""
    raw = _raw()
    raw[section][key] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.ERROR):
        assert tune_stage.main(["--dry-run"]) == 2
    assert f"{section}.{key}" in caplog.text and "less than or equal to" in caplog.text
    assert "variant" not in capsys.readouterr().out  # refused before any plan


def test_the_dry_run_prints_an_estimate_per_trial(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_raw()))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert tune_stage.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    estimates = [line for line in out.splitlines() if "M parameters, about" in line]
    assert len(estimates) == len(_raw()["sweep"]["variants"]), out
    assert all("MiB activations at batch" in line for line in estimates)


def test_a_trial_too_big_for_this_machine_is_refused_naming_the_keys(tmp_path: Path) -> None:
    from pipeline.sweep.estimate import check_trials_fit, estimate_trials

    params = _params(sweep={"variants": ["sa_quadratic_9"]})
    (small,) = estimate_trials(params, tmp_path)
    assert 0 < small.state_bytes < small.total_bytes  # activations counted
    check_trials_fit(params, tmp_path, memory=small.total_bytes + 1)
    with pytest.raises(ValueError, match=r"variants\.sa_quadratic_9 \(model\.\*\) / train\.batch_size: one trial"):
        check_trials_fit(params, tmp_path, memory=small.total_bytes - 1)
    raw = _raw()
    raw["train"]["batch_size"] *= 2
    raw["sweep"]["variants"] = ["sa_quadratic_9"]
    (double,) = estimate_trials(parse_params(raw, "x"), tmp_path)
    assert double.activation_bytes > small.activation_bytes  # grows with the batch
    raw = _raw()
    own_batch = {**raw["variants"]["sa_quadratic_9"], "train.batch_size": 2 * raw["train"]["batch_size"]}
    raw["variants"]["sa_quadratic_9"] = own_batch
    raw["sweep"]["variants"] = ["sa_quadratic_9"]
    (variant_batch,) = estimate_trials(parse_params(raw, "x"), tmp_path)  # a variant's own batch size counts
    assert (variant_batch.batch_size, variant_batch.activation_bytes) == (double.batch_size, double.activation_bytes)
