"""Fetching a study's runs from a real sqlite store: a local store's checkpoints are read where they lie, once, and
one checkpoint per architecture until a run's model is used."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from mlflow.entities import Param
from mlflow.tracking import MlflowClient

import analysis.runs
from analysis.runs import LoadedRun, fetch, fetch_all, local_artifacts, val_selected
from analysis.study import heads_table_of
from pipeline.config import ModelConfig
from pipeline.models import build_model
from pipeline.sweep.tracking import Store
from pipeline.sweep.tracking.store import ensure_experiment
from pipeline.trial.checkpoint import head_snapshot, save_model_checkpoint
from pipeline.trial.locality import measure_locality
from pipeline.trial.report import HEAD_HISTORY_FILE, LOCALITY_HISTORY_FILE


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///srv/mlartifacts/1/abc/artifacts", Path("/srv/mlartifacts/1/abc/artifacts")),
        ("/srv/mlartifacts/1/abc/artifacts", Path("/srv/mlartifacts/1/abc/artifacts")),
        ("mlflow-artifacts:/1/abc/artifacts", None),  # a server's proxied artifacts: downloaded
        ("s3://bucket/1/abc/artifacts", None),
    ],
)
def test_only_artifacts_on_this_machine_are_read_in_place(uri: str, expected: Path | None) -> None:
    assert local_artifacts(uri) == expected


def test_a_local_stores_checkpoint_is_read_in_place_and_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = ensure_experiment(client, "fetch", (tmp_path / "mlartifacts").as_uri())
    run_id = client.create_run(experiment_id).info.run_id
    cfg = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)
    checkpoint = tmp_path / "checkpoint"
    save_model_checkpoint(
        checkpoint,
        build_model(cfg, image_size=8, in_channels=3, num_classes=10),
        cfg,
        image_shape=(3, 8, 8),
        num_classes=10,
    )
    client.log_artifacts(run_id, str(checkpoint), artifact_path="checkpoint")
    client.log_metric(run_id, "test_acc", 0.5, step=1)
    client.set_terminated(run_id)
    reads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: reads.append(Path(path)) or load(path, *a, **k))
    cache = tmp_path / "cache"
    record = fetch(Store(client.tracking_uri), LoadedRun(run_id, "sa", 0, "finished", "tune"), cache)
    assert record.reason is None and record.model is not None and record.test_acc == 0.5
    assert record.checkpoint_dir == tmp_path / "mlartifacts" / run_id / "artifacts" / "checkpoint"
    assert reads == [record.checkpoint_dir / "checkpoint.pt"]  # one read, of the store's own file
    assert not cache.exists() or not any(cache.iterdir())  # nothing copied


def test_the_best_epoch_is_selected_on_validation_when_the_run_has_it(tmp_path: Path) -> None:
    """From a real store: test_acc at the epoch of best val_acc, beside the authors' best test_acc over epochs."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = ensure_experiment(client, "select", (tmp_path / "mlartifacts").as_uri())
    with_val, without_val = (client.create_run(experiment_id).info.run_id for _ in range(2))
    for epoch, (test_acc, val_acc) in enumerate([(0.50, 0.40), (0.70, 0.65), (0.75, 0.60)], start=1):
        for run_id in (with_val, without_val):
            client.log_metric(run_id, "test_acc", test_acc, step=epoch)
        client.log_metric(with_val, "val_acc", val_acc, step=epoch)
    records = [
        fetch(Store(client.tracking_uri), LoadedRun(r, "sa", 0, "finished", "tune"), tmp_path)
        for r in (with_val, without_val)
    ]
    assert (records[0].test_acc, records[0].best_test_acc, records[0].val_selected_test_acc) == (0.75, 0.75, 0.70)
    assert records[1].best_test_acc == 0.75 and math.isnan(records[1].val_selected_test_acc)


def test_validation_ties_select_the_earliest_epoch() -> None:
    history = pd.DataFrame({"epoch": [1, 2, 3], "test_acc": [0.5, 0.6, 0.7], "val_acc": [0.4, 0.6, 0.6]})
    assert val_selected(history) == 0.6
    assert math.isnan(val_selected(history.drop(columns="val_acc")))


def _seeds_of_one_model(tmp_path: Path, encoding: str, seeds: int = 3) -> tuple[MlflowClient, str, list[str]]:
    """``seeds`` finished runs of one small model in a sqlite store, each with its own checkpoint and the histories
    a trial writes (the locality history; the head history of Gaussian heads): client, experiment id, run ids."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = ensure_experiment(client, "seeds", (tmp_path / "mlartifacts").as_uri())
    cfg = ModelConfig(hidden=8, layers=2, ffn=16, heads=4, downsample=2, encoding=encoding)
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    run_ids = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = build_model(cfg, image_size=8, in_channels=3, num_classes=10).eval()
        folder = tmp_path / f"seed{seed}"
        save_model_checkpoint(folder, model, cfg, image_shape=(3, 8, 8), num_classes=10)
        locality = [{"epoch": 0, "layers": measure_locality(model, images)}]
        (folder / LOCALITY_HISTORY_FILE).write_text(json.dumps(locality))
        if (snapshot := head_snapshot(model, 0)) is not None:
            (folder / HEAD_HISTORY_FILE).write_text(json.dumps([snapshot]))
        run_id = client.create_run(experiment_id).info.run_id
        client.log_batch(run_id, params=[Param(f"model.{key}", str(value)) for key, value in cfg.model_dump().items()])
        client.log_artifacts(run_id, str(folder), artifact_path="checkpoint")
        client.log_metric(run_id, "test_acc", 0.5, step=1)
        client.set_terminated(run_id)
        run_ids.append(run_id)
    return client, experiment_id, run_ids


@pytest.mark.parametrize("encoding", ["quadratic", "learned"])
def test_seeds_of_one_architecture_read_one_checkpoint_until_their_model_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    """Three seeds of one model: the lowest seed's checkpoint gives the parameter and FLOP counts of all three, the
    others keep their own histories, and their head tables (from their last head snapshot on the loaded model's
    architecture) equal those of their own models, which load when first used."""
    client, experiment_id, run_ids = _seeds_of_one_model(tmp_path, encoding)
    reads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: reads.append(Path(path)) or load(path, *a, **k))
    records = [LoadedRun(run_id, "sa", seed, "finished", "tune") for seed, run_id in enumerate(run_ids)]
    fetch_all(Store(client.tracking_uri), records, tmp_path / "cache", (experiment_id,))
    first, *others = records
    assert reads == [first.checkpoint_dir / "checkpoint.pt"]  # the lowest seed's alone
    assert first.model_loaded and not any(r.model_loaded for r in others)
    for record in others:
        assert record.has_model and record.same_as is first and record.reason is None
        assert (record.n_params, record.flops_paper) == (first.n_params, first.flops_paper)
        assert record.locality_history and bool(record.head_history) == (encoding == "quadratic")
        from_history = heads_table_of(record)
        assert not record.model_loaded
        assert record.model is not None and record.model_loaded  # loaded now, from its own checkpoint
        pd.testing.assert_frame_equal(from_history, heads_table_of(record))
    assert reads[1:] == [r.checkpoint_dir / "checkpoint.pt" for r in others]
    assert not heads_table_of(others[0]).equals(heads_table_of(first))  # each seed's own heads


def test_seeds_past_history_seeds_count_by_their_metrics_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``HISTORY_SEEDS`` at 2, the third seed of a variant is read for its metrics alone: its architecture's
    counts, no history, no model to load (so no head table, head motion or claim asks for its checkpoint)."""
    client, experiment_id, run_ids = _seeds_of_one_model(tmp_path, "quadratic")
    monkeypatch.setattr(analysis.runs, "HISTORY_SEEDS", 2)
    reads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: reads.append(Path(path)) or load(path, *a, **k))
    records = [LoadedRun(run_id, "sa", seed, "finished", "tune") for seed, run_id in enumerate(run_ids)]
    fetch_all(Store(client.tracking_uri), records, tmp_path / "cache", (experiment_id,))
    first, second, third = records
    assert not first.metrics_only and not second.metrics_only and second.head_history and second.has_model
    assert third.metrics_only and third.reason is None and third.test_acc == 0.5
    assert not third.head_history and not third.locality_history and third.checkpoint_dir is None
    assert not third.has_model and third.model is None and reads == [first.checkpoint_dir / "checkpoint.pt"]
    counts = ("n_params", "flops_paper", "flops_full")
    assert [getattr(third, name) for name in counts] == [getattr(first, name) for name in counts]
    assert third.structure is first.model
