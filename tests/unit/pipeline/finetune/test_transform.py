"""The transform stage's planning, before Ray starts: config checks, source selection and refusals, the exactness
check on a saved ResNet18 (and that it fails a rebuild that is not exact)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.config import ConfigError, load_params, parse_params
from pipeline.data.prepared import PreparedData
from pipeline.finetune.plan import finetune_params, format_plans, plan_model
from pipeline.finetune.stage import model_key
from pipeline.finetune.transform import RECIPE as TRANSFORM
from pipeline.finetune.transform import check_exact
from pipeline.models import build_model
from pipeline.models.transformed_resnet import transform_resnet
from pipeline.sweep.identity import sweep_hash
from pipeline.sweep.manifest import TrialRecord, TuneManifest
from pipeline.trial.checkpoint import save_model_checkpoint
from pipeline.trial.device_data import DeviceData

PARAMS = Path(__file__).resolve().parents[4] / "params.yaml"


def _params(**transform: object) -> object:
    raw = load_params(PARAMS).model_dump(mode="json")
    raw["model"].update(resnet_width=4)
    raw["transform"].update(transform)
    return parse_params(raw)


def _trial(variant: str, seed: int, status: str = "finished", checkpoint: Path | None = None) -> TrialRecord:
    return TrialRecord(
        f"t-{variant}-{seed}", f"run-{variant}-{seed}", f"{variant} seed {seed}", variant, seed, status, 4,
        {"test_acc": 0.5}, str(checkpoint) if checkpoint else None, None, trial_key=f"key-{variant}-{seed}",
    )  # fmt: skip


def _manifest(trials: list[TrialRecord]) -> TuneManifest:
    return TuneManifest("abc", "tune-abc", "/ray/tune-abc", "test_acc", "max", "sqlite:///x.db", "1", "p", trials)


def test_the_default_study_transforms_resnet18() -> None:
    params = _params()
    assert params.transform.variants == {"t_resnet18": "resnet18"}
    assert params.model_for("t_resnet18").arch == "t_resnet18"
    assert params.model_for("t_resnet18").resnet_width == params.model_for("resnet18").resnet_width
    trained = finetune_params(TRANSFORM, params).train
    assert (trained.epochs, trained.lr) == (params.transform.epochs, params.train.lr * params.transform.lr_factor)


@pytest.mark.parametrize(
    ("transform", "message"),
    [
        ({"variants": {"t_x": "sa_quadratic_9"}}, "transform.variants.t_x: 'sa_quadratic_9' is not a resnet18 variant"),
        ({"variants": {"t_x": "nope"}}, "transform.variants.t_x: 'nope' is not a resnet18 variant"),
        ({"variants": {"resnet18": "resnet18"}}, "transform.variants.resnet18: also the name of variants.resnet18"),
        ({"variants": {"a/b": "resnet18"}}, "not a usable variant name"),
        ({"epochs": 0}, "transform.epochs"),
        ({"lr_factor": 0}, "transform.lr_factor"),
    ],
)
def test_bad_transform_params_are_refused_naming_the_key(transform: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _params(**transform)


def test_the_transform_section_is_not_part_of_the_sweep_identity() -> None:
    assert sweep_hash(_params(), "data") == sweep_hash(_params(epochs=7), "data")


def test_a_source_of_each_seed_is_selected() -> None:
    params = _params()
    trials = [_trial("sa_quadratic_9", 0), _trial("resnet18", 0, checkpoint=Path("/c"))]
    assert TRANSFORM.sources(params, _manifest(trials), Path("m.json")) == ([("t_resnet18", trials[1])], None)


@pytest.mark.parametrize(
    ("trials", "message"),
    [
        ([_trial("sa_quadratic_9", 0)], "t_resnet18 seed 0 is built from the sweep's resnet18 of the same seed"),
        ([_trial("resnet18", 1, checkpoint=Path("/c"))], "has none"),
        ([_trial("resnet18", 0, status="error", checkpoint=Path("/c"))], "did not finish \\(status 'error'\\)"),
        ([_trial("resnet18", 0)], "did not finish"),  # finished, but no checkpoint anywhere
    ],
)
def test_a_missing_or_unfinished_source_is_refused_naming_the_variant(trials: list, message: str) -> None:
    with pytest.raises(ValueError, match=f"transform.variants.t_resnet18: .*{message}"):
        TRANSFORM.sources(_params(), _manifest(trials), Path("m.json"))


def _data(n: int = 40) -> PreparedData:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    classes = tuple(str(c) for c in range(10))
    return PreparedData(images, labels, images, labels, classes, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


def _saved_resnet(tmp_path: Path, params: object) -> TrialRecord:
    torch.manual_seed(0)
    model = build_model(params.model_for("resnet18"), image_size=8)
    with torch.no_grad():  # batch-norm statistics of a trained network, not the identity
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    save_model_checkpoint(tmp_path, model, params.model_for("resnet18"), image_shape=(3, 8, 8), num_classes=10)
    return _trial("resnet18", 0, checkpoint=tmp_path)


def test_a_saved_resnet_is_rebuilt_exactly_and_counted(tmp_path: Path) -> None:
    params = _params()
    plan = plan_model(TRANSFORM, params, "t_resnet18", _saved_resnet(tmp_path, params))
    assert plan.key == "t_resnet18-seed0" and len(plan.facts["converted"]) == 17
    assert plan.params_after == plan.params_before + 17 * 27  # 9 centres (2 each) and 9 spreads per converted layer
    exact = check_exact(plan, DeviceData.from_prepared(_data(), torch.device("cpu")), batch_size=16)
    assert exact["test_acc_step0"] == exact["source_test_acc"]
    assert exact["max_logit_diff_float64"] <= 1e-9
    assert exact["max_logit_diff_float32"] <= 1e-4
    assert "t_resnet18-seed0 (from resnet18 run run-resnet18-0): 17 3x3 convolutions" in format_plans(
        TRANSFORM, [plan], None, params
    )
    lr = finetune_params(TRANSFORM, params).train_for("resnet18").lr  # the dry run prints what fine-tuning uses
    assert f"as 9-head attention; fine-tuning lr {lr:g}" in format_plans(TRANSFORM, [plan], None, params)
    assert model_key(TRANSFORM, params, plan) != model_key(TRANSFORM, _params(epochs=5), plan)


def test_a_rebuild_that_is_not_exact_is_refused(tmp_path: Path) -> None:
    params = _params()
    plan = plan_model(TRANSFORM, params, "t_resnet18", _saved_resnet(tmp_path, params))
    plan.model = transform_resnet(plan.source_model, alpha=0.5)  # heads leak to their neighbours: another function
    with pytest.raises(
        ValueError, match="t_resnet18-seed0: the rebuild of resnet18 run run-resnet18-0 .*not fine-tuning"
    ):
        check_exact(plan, DeviceData.from_prepared(_data(), torch.device("cpu")), batch_size=16)
