"""``sweep.checkpoint_interval_s`` through Ray Tune itself: the trainable hands Tune a checkpoint every epoch at 0,
and only after the last epoch when the interval is longer than the trial. (Fewer checkpoints are what spare the
driver Tune's forced experiment snapshots; their CPU is a figure of benchmarks/sweep_at_scale.py, not a test.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray import tune

from pipeline.config import load_params
from pipeline.data.sources import prepare_dataset
from pipeline.sweep.identity import trial_codes
from pipeline.trial.checkpoint import load_checkpoint
from pipeline.trial.trainable import train_trial
from tests.integration.conftest import ROOT, tiny_params

pytestmark = pytest.mark.slow


def checkpointed_epochs(storage: Path, interval_s: float) -> tuple[list[int], int]:
    """The epochs of every checkpoint one 3-epoch trial handed Tune (all kept), and the epochs it reported."""
    raw = tiny_params(checkpoint_interval_s=interval_s)
    raw["train"]["epochs"] = 3
    file = storage / f"params-{interval_s:g}.yaml"
    file.write_text(yaml.safe_dump(raw))
    params = load_params(file)  # the project's loader: YAML 1.1 reads 1e-5 as a string
    trainable = tune.with_parameters(
        train_trial,
        data=prepare_dataset(params.data, ROOT),
        params_json=params.model_dump(mode="json"),
        code_version=trial_codes(params, ["resnet18"]),
    )
    name = f"interval-{interval_s:g}"
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"variant": "resnet18", "seed": 0},
        run_config=tune.RunConfig(name=name, storage_path=str(storage), checkpoint_config=tune.CheckpointConfig()),
    )
    [result] = tuner.fit()
    assert result.error is None, result.error
    kept = sorted((storage / name).glob("*/checkpoint_*"))
    return [load_checkpoint(directory)["epoch"] for directory in kept], len(result.metrics_dataframe)


def test_a_trial_checkpoints_every_epoch_or_at_most_every_interval(ray_address: str, tmp_path: Path) -> None:
    assert checkpointed_epochs(tmp_path, 0) == ([1, 2, 3], 3)
    assert checkpointed_epochs(tmp_path, 3600) == ([3], 3)  # every epoch reported, one checkpoint: the last
