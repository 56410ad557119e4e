"""The prune recipe and the family's planning, before Ray starts: config checks, source selection, refusals, the
pruned plan, identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ConfigError, load_params, params_hash, parse_params
from pipeline.finetune.plan import check_fresh, finetune_params, format_plans, local_sources, plan_model
from pipeline.finetune.prune import RECIPE as PRUNE
from pipeline.finetune.stage import finetune_code, finetune_name, model_key
from pipeline.models import build_model
from pipeline.sweep.manifest import TrialRecord, TuneManifest
from pipeline.trial.checkpoint import save_model_checkpoint

PARAMS = Path(__file__).resolve().parents[4] / "params.yaml"


def _params(**prune: object) -> object:
    raw = load_params(PARAMS).model_dump(mode="json")
    raw["model"].update(hidden=8, layers=2, ffn=16, learned_dim=8)
    raw["prune"].update(prune)
    return parse_params(raw)


def _trial(variant: str, seed: int, status: str = "finished", checkpoint: Path | None = None) -> TrialRecord:
    return TrialRecord(
        f"t-{variant}-{seed}",
        f"run-{variant}-{seed}",
        f"{variant}-seed{seed}",
        variant,
        seed,
        status,
        4,
        {"test_acc": 0.5},
        str(checkpoint) if checkpoint else None,
        None,
    )


def _manifest(trials: list[TrialRecord], name: str = "tune-abc") -> TuneManifest:
    return TuneManifest("abc", name, "/ray/tune-abc", "test_acc", "max", "sqlite:///x.db", "1", "p", trials)


def test_default_prunes_every_generalized_variant_of_the_sweep() -> None:
    assert _params().prune_variants() == ["sa_generalized_9"]


@pytest.mark.parametrize(
    ("prune", "message"),
    [
        ({"variants": ["sa_learned_9"]}, "cannot prune 'sa_learned_9': its 'learned' encoding has no covariance"),
        ({"variants": ["resnet18"]}, "cannot prune 'resnet18': ResNet18 has no attention heads"),
        ({"variants": ["nope"]}, "prune.variants: 'nope' is not a variant of the sweep"),
        ({"lr_factor": 0}, "prune.lr_factor"),
        ({"fraction": 1.5}, "prune.fraction"),
        ({"max_condition": 0.5}, "prune.max_condition"),
        ({"min_eigenvalue": -1}, "prune.min_eigenvalue"),
        ({"mode": "random"}, "prune.mode"),
        ({"epochs": 0}, "prune.epochs"),
    ],
)
def test_bad_prune_params_are_refused_naming_the_key(prune: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _params(**prune)


def test_only_finished_trials_of_the_pruned_variants_are_selected(tmp_path: Path) -> None:
    trials = [
        _trial("sa_generalized_9", 0, checkpoint=tmp_path),
        _trial("sa_generalized_9", 1, "error"),
        _trial("sa_generalized_9", 2, "early_stopped", tmp_path),
        _trial("sa_quadratic_9", 0, checkpoint=tmp_path),
    ]
    chosen, skipped = PRUNE.sources(_params(), _manifest(trials), Path("m.json"))
    assert [(name, s.variant, s.seed) for name, s in chosen] == [("sa_generalized_9", "sa_generalized_9", 0)]
    assert [(s["seed"], s["reason"].split(" (")[0]) for s in skipped] == [
        ("1", "trial status 'error'"),
        ("2", "trial status 'early_stopped'"),
    ]


def test_a_stale_tune_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stale tune manifest: it names sweep tune-old"):
        check_fresh(_params(), _manifest([], name="tune-old"), Path("results/tune/manifest.json"), tmp_path)


def test_a_checkpoint_neither_on_disk_nor_in_mlflow_is_refused(tmp_path: Path) -> None:
    gone = _trial("sa_generalized_9", 0, checkpoint=tmp_path / "gone")
    with pytest.raises(FileNotFoundError, match="no longer exists .* and none in MLflow"):
        local_sources([gone], "sqlite:///unused.db", tmp_path / "cache", Path("m.json"))


def test_a_checkpoint_on_disk_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.pt").write_bytes(b"x")
    here = _trial("sa_generalized_9", 0, checkpoint=tmp_path / "ckpt")
    assert local_sources([here], "sqlite:///unused.db", tmp_path / "cache", Path("m.json")) == [here]


@pytest.mark.parametrize("mode", ["fraction", "threshold"])
def test_plan_prunes_a_trained_checkpoint_and_counts_what_it_saves(tmp_path: Path, mode: str) -> None:
    params = _params(mode=mode, fraction=0.5)
    model_cfg = params.model_for("sa_generalized_9")
    model = build_model(model_cfg, image_size=8)
    if mode == "threshold":  # plant one uniform head in layer 2
        model.layers[1].attention.encoding.sqrt_sigma_inv.data[3] = 1e-4
    save_model_checkpoint(tmp_path, model, model_cfg, image_shape=(3, 8, 8), num_classes=10)
    plan = plan_model(PRUNE, params, "sa_generalized_9", _trial("sa_generalized_9", 0, checkpoint=tmp_path))
    expected = [4, 4] if mode == "fraction" else [0, 1]
    assert plan.facts["pruned_heads"] == expected and plan.facts["heads_per_layer"] == [9 - n for n in expected]
    assert plan.params_after < plan.params_before and plan.flops_after["paper"] < plan.flops_before["paper"]
    per_head = 2 + 2 * 2 + 8 * 8  # centre, S, the head's value columns (hidden 8 -> 8)
    assert plan.params_before - plan.params_after == sum(expected) * per_head
    assert sum(d["pruned"] for layer in plan.facts["decisions"] for d in layer) == sum(expected)
    assert "heads cut per layer" in format_plans(PRUNE, [plan], [], params)
    lr = finetune_params(PRUNE, params).train_for("sa_generalized_9").lr  # the dry run prints what fine-tuning uses
    assert f"; fine-tuning lr {lr:g}" in format_plans(PRUNE, [plan], [], params)


def test_fine_tuning_uses_the_prune_schedule_and_no_asha() -> None:
    params = _params(lr_factor=0.1, epochs=3)
    tuned = finetune_params(PRUNE, params)
    assert tuned.train.lr == pytest.approx(params.train.lr * 0.1) and tuned.train.epochs == 3
    assert not tuned.sweep.asha.enabled and tuned.model == params.model


def test_a_pruned_models_identity_is_its_source_trial_and_the_prune_params() -> None:
    class Plan:  # what model_key reads of a plan
        source = _trial("sa_generalized_9", 0)
        key, name = "sa_generalized_9-seed0", "sa_generalized_9"

    Plan.source.trial_key = "source-key"
    key = model_key(PRUNE, _params(), Plan())
    assert key == model_key(PRUNE, _params(), Plan())
    assert model_key(PRUNE, _params(fraction=0.5), Plan()) != key
    assert model_key(PRUNE, _params(epochs=7), Plan()) != key  # fine-tuning epochs
    assert (
        model_key(PRUNE, _params().model_copy(update={"seed": 3}), Plan()) == key
    )  # not in the source trial's identity
    code = finetune_code(_params(), "sa_generalized_9", "pipeline.models.pruning")  # the rule's and fine-tuning's
    assert key == params_hash({"source": "source-key", "prune": _params().prune.model_dump(mode="json"), "code": code})
    Plan.source.trial_key = "another-source"
    assert model_key(PRUNE, _params(), Plan()) != key
    name = finetune_name("prune", [key, "b"])
    assert name.startswith("prune-") and name == finetune_name("prune", ["b", key])
    assert name != finetune_name("prune", [key])
