"""Head pruning (App. A.1): which heads the rule cuts, and that cutting them changes nothing else."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pipeline.config import PAPER_VARIANTS, ModelConfig
from pipeline.measure.counting import count_flops, count_parameters
from pipeline.measure.reference import PAPER_FIGURES, PAPER_PRUNED_HEADS
from pipeline.models import build_model
from pipeline.models.pruning import (
    HeadDecision,
    covariance_geometry,
    head_decisions,
    heads_to_cut,
    keep_per_layer,
    prune_model,
    pruned_per_layer,
)

SMALL = ModelConfig(hidden=16, layers=3, ffn=24, learned_dim=8, resnet_width=4)
HEADS = 4
FLAT = torch.eye(2) * 1e-4  # S: Sigma^-1 = 1e-8 I, attends uniformly
NORMAL = torch.tensor([[1.0, 0.0], [0.2, 0.8]])  # condition number ~1.6


def _stripe(condition: float) -> torch.Tensor:
    return torch.diag(torch.tensor([1.0, condition**-0.5]))  # S: Sigma^-1 = diag(1, 1 / condition)


def _cfg(variant: str) -> ModelConfig:
    """The variant at a small size, with ``HEADS`` heads per layer."""
    return PAPER_VARIANTS[variant].apply(SMALL).model_copy(update={"heads": HEADS})


def _model(variant: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(_cfg(variant), image_size=8)


def _plant(model: torch.nn.Module, planted: dict[tuple[int, int], torch.Tensor], default=NORMAL) -> None:
    """Give every head ``S = default`` except the ``planted`` (layer, head) ones."""
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            s = layer.attention.encoding.sqrt_sigma_inv
            for h in range(s.shape[0]):
                s[h] = planted.get((i, h), default)


def _zero_value_columns(model: torch.nn.Module, cut: list[list[int]]) -> None:
    with torch.no_grad():
        for layer, heads in zip(model.layers, cut, strict=True):
            dim = layer.attention.in_dim
            for h in heads:
                layer.attention.value.weight[:, h * dim : (h + 1) * dim] = 0


def _cut(decisions: list[list[HeadDecision]]) -> list[list[int]]:
    return [[d.head for d in layer if d.pruned] for layer in decisions]


# --- the paper's rule ---


def test_threshold_rule_cuts_the_planted_flat_and_stripe_heads_only() -> None:
    model = _model("sa_generalized_9")
    _plant(model, {(0, 1): FLAT, (1, 0): _stripe(1e6), (1, 3): _stripe(1e4), (2, 2): FLAT @ _stripe(1e6)})
    decisions = head_decisions(covariance_geometry(model), mode="threshold", min_eigenvalue=1e-5, max_condition=1e3)
    assert _cut(decisions) == [[1], [0, 3], [2]]
    assert pruned_per_layer(decisions) == [1, 2, 1] and keep_per_layer(decisions) == [[0, 2, 3], [1, 2], [0, 1, 3]]
    flat, stripe, both = decisions[0][1], decisions[1][0], decisions[2][2]
    assert flat.reason.startswith("uniform: largest eigenvalue 1e-8 < 1e-5")
    assert flat.largest_eigenvalue == pytest.approx(1e-8) and flat.condition_number == pytest.approx(1.0)
    assert stripe.reason.startswith("stripe: condition number 1e6 > 1e3")
    assert stripe.eigenvalues[0] < stripe.eigenvalues[1] == stripe.largest_eigenvalue
    assert both.reason.startswith("uniform"), "flat and a stripe: reported as the stronger, uniform"
    assert all(d.reason == "kept" and d.condition_number < 2 for d in decisions[0] if not d.pruned)
    # the paper's text's 1e5 keeps the 1e4 stripe
    loose = head_decisions(covariance_geometry(model), mode="threshold", min_eigenvalue=1e-5, max_condition=1e5)
    assert _cut(loose) == [[1], [0], [2]]


def test_condition_numbers_are_float64_not_float32_noise() -> None:
    """A tilted stripe: ``S S^T`` in float32 loses the small eigenvalue (1e-12 of the large one) to rounding and
    reads a condition number near 1e7-1e8 or inf; the geometry is computed in float64 and reads the truth."""
    angle = torch.tensor(0.6)
    rotation = torch.stack([torch.stack([angle.cos(), -angle.sin()]), torch.stack([angle.sin(), angle.cos()])])
    tilted = rotation @ torch.diag(torch.tensor([1.0, 1e-6]))  # S: Sigma^-1 eigenvalues 1 and 1e-12
    model = _model("sa_generalized_9")
    _plant(model, {(0, 0): tilted})
    s = model.layers[0].attention.encoding.sqrt_sigma_inv[0].detach().double()
    truth = torch.linalg.eigvalsh(s @ s.T)  # of the float32 parameters, in float64
    decision = head_decisions(covariance_geometry(model))[0][0]
    assert decision.condition_number == pytest.approx(float(truth[1] / truth[0]), rel=1e-6)
    assert decision.condition_number > 1e11
    noisy = torch.linalg.eigvalsh((s.float() @ s.float().T).double())  # what float32 gave
    assert not noisy[0] > 0 or float(noisy[1] / noisy[0]) < 1e10


def test_singular_precision_has_infinite_condition_number_and_is_cut() -> None:
    model = _model("sa_generalized_9")
    _plant(model, {(0, 0): torch.tensor([[1.0, 0.0], [1.0, 0.0]])})  # S S^T = [[1, 1], [1, 1]]: eigenvalues 0, 2
    decision = head_decisions(covariance_geometry(model), mode="threshold")[0][0]
    assert decision.pruned and decision.reason == "stripe: condition number inf > 1e3"
    assert decision.eigenvalues[1] == pytest.approx(2.0) and decision.condition_number == math.inf


def test_isotropic_heads_have_condition_number_one_and_only_the_flat_rule_cuts_them() -> None:
    model = _model("sa_quadratic_9")
    with torch.no_grad():
        model.layers[1].attention.encoding.spreads[2] = 1e-3  # s^2 = 1e-6 < 1e-5
        model.layers[2].attention.encoding.spreads[0] = 4e-3  # s^2 = 1.6e-5: kept
    decisions = head_decisions(covariance_geometry(model), mode="threshold", min_eigenvalue=1e-5, max_condition=1.0)
    assert {d.condition_number for layer in decisions for d in layer} == {1.0}
    assert _cut(decisions) == [[], [2], []]
    assert decisions[1][2].reason == "uniform: largest eigenvalue 1e-6 < 1e-5"


# --- ours: a fixed share of the most degenerate heads per layer ---


@pytest.mark.parametrize(
    ("num_heads", "fraction", "expected"),
    [(9, 0.0, 0), (9, 0.1, 1), (9, 0.5, 4), (9, 1.0, 9), (100, 0.29, 29), (3, 0.34, 1), (0, 0.5, 0)],
)
def test_fraction_mode_floors_but_cuts_at_least_one_head(num_heads: int, fraction: float, expected: int) -> None:
    assert heads_to_cut(num_heads, fraction) == expected


def test_fraction_mode_cuts_the_most_degenerate_heads_of_each_layer() -> None:
    """Condition number first (a 1e2 stripe beats a round head), then flatness among equal conditions."""
    model = _model("sa_generalized_9")
    planted = {
        (0, 2): _stripe(1e6),
        (0, 3): FLAT,  # isotropic like the others, but the flattest
        (1, 0): _stripe(1e2),  # below the paper's threshold: fraction mode cuts it anyway
        (1, 1): _stripe(1e4),
        (2, 1): _stripe(10.0),
        (2, 3): _stripe(20.0),
    }
    _plant(model, planted, default=torch.eye(2))
    decisions = head_decisions(covariance_geometry(model), mode="fraction", fraction=0.5)
    assert _cut(decisions) == [[2, 3], [0, 1], [1, 3]]
    assert decisions[1][0].reason.startswith("among the 2 most degenerate of layer 1's 4 heads (condition number 100")
    assert decisions[1][2].reason == "kept"
    assert _cut(head_decisions(covariance_geometry(model), mode="fraction", fraction=0.25)) == [[2], [1], [3]]
    assert _cut(head_decisions(covariance_geometry(model), mode="fraction", fraction=1.0)) == [list(range(4))] * 3


def test_bad_modes_and_fractions_name_what_is_allowed() -> None:
    geometry = covariance_geometry(_model("sa_generalized_9"))
    with pytest.raises(ValueError, match=r"valid: \['threshold', 'fraction'\]"):
        head_decisions(geometry, mode="random")
    for fraction in (None, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"fraction in \[0, 1\]"):
            head_decisions(geometry, mode="fraction", fraction=fraction)


def test_decisions_round_trip_through_strict_json() -> None:
    model = _model("sa_generalized_9")
    _plant(model, {(0, 0): torch.tensor([[1.0, 0.0], [1.0, 0.0]]), (1, 1): FLAT})
    decisions = head_decisions(covariance_geometry(model), mode="threshold")
    text = json.dumps([[d.to_dict() for d in layer] for layer in decisions], allow_nan=False)
    records = json.loads(text)
    assert records[0][0]["condition_number"] == "inf" and records[0][0]["pruned"] is True
    assert set(records[0][0]) == {
        "layer",
        "head",
        "eigenvalues",
        "largest_eigenvalue",
        "condition_number",
        "pruned",
        "reason",
    }
    assert [[HeadDecision.from_dict(r) for r in layer] for layer in records] == decisions


# --- models without covariances ---


@pytest.mark.parametrize(
    ("variant", "message"), [("sa_learned_9", "learned encoding has no covariance"), ("resnet18", "ResNet")]
)
def test_models_without_a_covariance_are_refused(variant: str, message: str) -> None:
    model = _model(variant)
    with pytest.raises(ValueError, match=message) as refusal:
        covariance_geometry(model)
    assert "generalized_quadratic" in str(refusal.value), "the refusal names the encodings that can be pruned"
    with pytest.raises(ValueError, match=message):
        prune_model(model, [])


def test_stale_decisions_are_refused() -> None:
    model = _model("sa_generalized_9")
    _plant(model, {(0, 1): FLAT})
    decisions = head_decisions(covariance_geometry(model))
    prune_model(model, decisions)
    assert model.heads_per_layer == [3, 4, 4]
    with pytest.raises(ValueError, match=r"decisions cover heads per layer \[4, 4, 4\], the model has \[3, 4, 4\]"):
        prune_model(model, decisions)


# --- pruning changes nothing but the cut heads' (zero) contribution ---


def test_pruning_heads_with_zero_value_columns_keeps_the_logits() -> None:
    """Layer 1 loses every head (App. A.1's rule can empty a layer): its branch becomes the value bias."""
    model = _model("sa_generalized_9").double().eval()
    planted = {(0, 1): FLAT, (0, 3): _stripe(1e6)} | {(1, h): FLAT for h in range(4)} | {(2, 0): _stripe(1e4)}
    _plant(model, planted)
    decisions = head_decisions(covariance_geometry(model), mode="threshold")
    assert _cut(decisions) == [[1, 3], [0, 1, 2, 3], [0]]
    _zero_value_columns(model, _cut(decisions))
    images = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    expected = model(images)
    prune_model(model, decisions)
    assert model.heads_per_layer == [2, 0, 3]
    torch.testing.assert_close(model(images), expected, rtol=0, atol=1e-6)
    assert not torch.equal(expected, torch.zeros_like(expected))


def test_a_headless_layer_drops_its_encoding_and_value_columns() -> None:
    model = _model("sa_generalized_9")
    params, flops = count_parameters(model), count_flops(model, (3, 8, 8)).paper
    _plant(model, {(2, h): FLAT for h in range(4)})
    prune_model(model, head_decisions(covariance_geometry(model)))
    hidden, heads, tokens = SMALL.hidden, HEADS, 4 * 4
    assert params - count_parameters(model) == heads * (2 + 4) + heads * hidden * hidden  # (Delta, S) + value columns
    assert flops - count_flops(model, (3, 8, 8)).paper == heads * 2 * tokens * hidden * hidden
    assert model.layers[2].attention.value.weight.shape == (hidden, 0)


def test_the_papers_cut_gives_the_papers_pruned_size() -> None:
    """Plant (2, 4, 1, 2, 6, 0) degenerate heads in the paper-size model: App. A.1's 12.1M -> 9.7M parameters."""
    cfg = PAPER_VARIANTS["sa_generalized_9"].apply(ModelConfig())
    torch.manual_seed(0)
    model = build_model(cfg, image_size=32)
    full, pruned = PAPER_FIGURES["sa_generalized_9"], PAPER_FIGURES["sa_generalized_9_pruned"]
    assert count_parameters(model) == full.params and count_flops(model).paper == full.flops
    degenerate = (FLAT, _stripe(1e6))
    _plant(model, {(i, 8 - k): degenerate[k % 2] for i, cut in enumerate(PAPER_PRUNED_HEADS) for k in range(cut)})
    decisions = head_decisions(covariance_geometry(model), mode="threshold", min_eigenvalue=1e-5, max_condition=1e3)
    assert pruned_per_layer(decisions) == list(PAPER_PRUNED_HEADS)
    prune_model(model, decisions)
    cut, hidden, tokens = sum(PAPER_PRUNED_HEADS), 400, 16 * 16
    assert full.params - count_parameters(model) == cut * (6 + hidden * hidden) == 12_087_006 - 9_686_916
    assert full.flops - count_flops(model).paper == cut * 2 * tokens * hidden * hidden == 6_175_956_800 - 4_947_156_800
    assert (count_parameters(model), count_flops(model).paper) == (pruned.params, pruned.flops)


def test_a_pruned_checkpoint_with_a_headless_layer_loads_with_the_same_logits(tmp_path) -> None:
    from pipeline.trial.checkpoint import model_from_checkpoint, save_model_checkpoint

    cfg = _cfg("sa_generalized_9")
    model = _model("sa_generalized_9")
    _plant(model, {(0, 2): _stripe(1e6)} | {(1, h): FLAT for h in range(4)})
    with torch.no_grad():
        model.layers[1].attention.value.bias.normal_()  # the headless layer's only attention output
    prune_model(model, head_decisions(covariance_geometry(model)))
    assert model.heads_per_layer == [3, 0, 4]
    save_model_checkpoint(tmp_path, model, cfg, image_shape=(3, 8, 8), num_classes=10)
    loaded = model_from_checkpoint(tmp_path)
    assert loaded.heads_per_layer == [3, 0, 4]
    images = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(loaded(images), model.eval()(images), rtol=0, atol=0)
