"""Locality per head, measured in the trial: closed forms, each layer's own input, and the per-epoch history."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.config import ModelConfig, TrainConfig
from pipeline.data.prepared import PreparedData
from pipeline.encodings import ENCODINGS
from pipeline.models import build_model
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import build_encoding
from pipeline.models.quadratic import QuadraticEncoding
from pipeline.models.sa_net import SelfAttentionNet, space_to_depth
from pipeline.trial.checkpoint import load_locality_history
from pipeline.trial.locality import head_locality, layer_summary, measure_locality
from pipeline.trial.loop import run_trial
from pipeline.trial.report import LOCALITY_METRICS, epoch_metrics, initial_metrics, locality_key

GRID = (6, 7)
N = GRID[0] * GRID[1]


def _distances(grid: tuple[int, int]) -> torch.Tensor:
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], -1).double()  # (N, 2)
    return torch.cdist(pos, pos)  # (N, N)


def test_a_one_hot_head_looks_exactly_as_far_as_its_key() -> None:
    """Each query attends with probability 1 to the key 1 row down and 2 columns right, or to itself where that
    key is off the grid: distance sqrt(5) for those queries, 0 for the others, entropy 0, peak 1."""
    probs = torch.zeros(1, N, N)
    shifted = 0
    for row in range(GRID[0]):
        for col in range(GRID[1]):
            key = (row + 1, col + 2) if row + 1 < GRID[0] and col + 2 < GRID[1] else (row, col)
            shifted += key != (row, col)
            probs[0, row * GRID[1] + col, key[0] * GRID[1] + key[1]] = 1.0
    measured = head_locality(probs, GRID)
    assert measured["mean_distance"].item() == pytest.approx(shifted * math.sqrt(5) / N)
    assert measured["entropy"].item() == 0.0 and measured["peak_probability"].item() == 1.0


def test_a_uniform_head_has_entropy_log_n_and_the_grids_mean_distance() -> None:
    measured = head_locality(torch.full((2, N, N), 1.0 / N), GRID)
    torch.testing.assert_close(measured["entropy"], torch.full((2,), math.log(N), dtype=torch.float64))
    torch.testing.assert_close(measured["peak_probability"], torch.full((2,), 1.0 / N, dtype=torch.float64))
    expected = _distances(GRID).mean().item()  # every key equally likely from every query
    torch.testing.assert_close(measured["mean_distance"], torch.full((2,), expected, dtype=torch.float64))


def test_a_sharp_gaussian_head_is_convolution_like_away_from_the_border() -> None:
    """Theorem 1's head (large alpha, integer centre) puts all its mass on one shift: peak 1 over interior queries."""
    encoding = QuadraticEncoding(1)
    with torch.no_grad():
        encoding.centres.copy_(torch.tensor([[1.0, -1.0]]))
        encoding.spreads.fill_(20.0)
    measured = head_locality(MultiHeadSelfAttention(encoding, in_dim=1).attention_probs(GRID), GRID)
    assert measured["peak_probability"].item() == pytest.approx(1.0, abs=1e-6)


class ContentAttention(MultiHeadSelfAttention):
    """Test double: positional scores plus the content's dot products ``x_q . x_k / sqrt(D)``, so the probabilities
    differ from one input to another (an attention the paper does not have)."""

    def probs_for(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        content = x @ x.transpose(1, 2) / math.sqrt(x.shape[-1])  # (B, N, N)
        return (self.attention_probs(grid).log()[None] + content[:, None]).softmax(-1)  # (B, H, N, N)


def _content_net(layers: int = 3, heads: int = 3) -> SelfAttentionNet:
    torch.manual_seed(0)
    encodings = [build_encoding("quadratic", heads, max_grid=4) for _ in range(layers)]
    net = SelfAttentionNet(encodings, image_size=8, hidden=16, ffn=16, dropout=0.0, attention_dropout=0.0)
    for layer in net.layers:
        content = ContentAttention(layer.attention.encoding, 16)
        content.value = layer.attention.value
        layer.attention = content
    return net.eval()


def test_the_content_path_applies_each_images_probabilities() -> None:
    torch.manual_seed(1)
    attention = _content_net().layers[0].attention
    x = torch.randn(2, 16, 16)
    probs = attention.probs_for(x, (4, 4))  # (B, H, N, N)
    heads = torch.einsum("bhqk,bkd->bqhd", probs, x).reshape(2, 16, -1)  # concat_h p_h x
    torch.testing.assert_close(attention(x, (4, 4)), attention.value(heads))


def test_each_layer_is_measured_on_its_own_input() -> None:
    """What the hooks measure equals each layer's probabilities for the input that layer receives, and differs from
    feeding every layer the first layer's input (which this test would catch)."""
    net = _content_net()
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    x = net.embedding(space_to_depth(images, net.downsample))  # the first layer's input
    first_input, expected = x, []
    with torch.no_grad():
        for layer in net.layers:
            expected.append(head_locality(layer.attention.probs_for(x, net.grid), net.grid))
            x = layer(x, net.grid)
    measured = measure_locality(net, images)
    assert len(measured) == len(net.layers)
    for layer_values, own in zip(measured, expected, strict=True):
        for metric in LOCALITY_METRICS:
            torch.testing.assert_close(torch.tensor(layer_values[metric], dtype=torch.float64), own[metric])
    with torch.no_grad():
        wrong = head_locality(net.layers[2].attention.probs_for(first_input, net.grid), net.grid)
    assert (wrong["entropy"] - expected[2]["entropy"]).abs().max() > 0.05  # the first layer's input: other numbers


def test_position_only_attention_is_measured_the_same_on_any_input() -> None:
    model = build_model(ModelConfig(hidden=8, layers=2, heads=3, ffn=8), image_size=8)
    first = measure_locality(model, torch.randn(2, 3, 8, 8))
    assert first == measure_locality(model, torch.randn(5, 3, 8, 8))
    assert model.training  # left in the mode it was in


def test_pruned_layers_and_resnets() -> None:
    model = build_model(ModelConfig(hidden=8, layers=2, heads=3, ffn=8), image_size=8, heads_per_layer=[2, 0])
    per_layer = measure_locality(model, torch.randn(2, 3, 8, 8))
    assert [len(layer["entropy"]) for layer in per_layer] == [2, 0]
    summary = layer_summary(per_layer)
    assert set(summary) == {locality_key(1, metric) for metric in LOCALITY_METRICS}  # layer 2 has no heads
    assert summary[locality_key(1, "entropy")] == pytest.approx(sum(per_layer[0]["entropy"]) / 2)
    resnet = build_model(ModelConfig(arch="resnet18", resnet_width=4), image_size=8)
    assert measure_locality(resnet, torch.randn(2, 3, 8, 8)) is None


def _data(n_train: int = 32, n_test: int = 40) -> PreparedData:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n_train + n_test, 3, 8, 8), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 3, (n_train + n_test,), generator=g)
    stats = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    return PreparedData(images[:n_train], labels[:n_train], images[n_train:], labels[n_train:], ("a", "b", "c"), *stats)


@pytest.mark.parametrize("encoding", ["quadratic", "learned", "gpsa"])
def test_every_epoch_reports_locality_and_keeps_every_heads_history_across_a_resume(
    encoding: str, tmp_path: Path
) -> None:
    model_cfg = ModelConfig(encoding=encoding, hidden=8, layers=2, heads=3, ffn=8, learned_dim=4)
    train_cfg = TrainConfig(epochs=3, batch_size=16, eval_batch_size=40, device="cpu", seed=1)
    reports: list[dict[str, float]] = []

    def keep(metrics: dict[str, float], checkpoint: Path) -> None:
        reports.append(metrics)
        shutil.copytree(checkpoint, tmp_path / f"epoch{metrics['epoch']}")
        if metrics["epoch"] == 2 and len(reports) == 2:
            raise KeyboardInterrupt  # stopped after epoch 2, resumed from its checkpoint below

    with pytest.raises(KeyboardInterrupt):
        run_trial(model_cfg, train_cfg, _data(), keep)
    run_trial(model_cfg, train_cfg, _data(), keep, resume_from=tmp_path / "epoch2")
    assert [r["epoch"] for r in reports] == [1, 2, 3]
    per_head = {  # what the encoding's registry entry declares it reports, per head
        locality_key(layer, f"head{head}/{name}")
        for layer in (1, 2)
        for head in (1, 2, 3)
        for name in ENCODINGS[encoding].head_reports
    }
    for report in reports:
        keys = {k for k in epoch_metrics(report) if k.startswith("locality/")}
        assert keys == {locality_key(layer, metric) for layer in (1, 2) for metric in LOCALITY_METRICS} | per_head
    history = load_locality_history(tmp_path / "epoch3")
    assert [h["epoch"] for h in history] == [0, 1, 2, 3]  # epoch 0: before training; the resume kept 0..2
    # epoch 0's per-layer means ride with epoch 1's report only (MLflow step 0), never again after the resume
    initial = initial_metrics(reports[0])
    assert initial.keys() == {locality_key(layer, metric) for layer in (1, 2) for metric in LOCALITY_METRICS} | per_head
    assert initial[locality_key(1, "entropy")] == pytest.approx(sum(history[0]["layers"][0]["entropy"]) / 3)
    assert initial_metrics(reports[1]) == {} == initial_metrics(reports[2])
    assert all(len(layer[metric]) == 3 for h in history for layer in h["layers"] for metric in LOCALITY_METRICS)
    for report, snapshot in zip(reports, history[1:], strict=True):
        per_head = snapshot["layers"][1]["mean_distance"]
        assert report[locality_key(2, "mean_distance")] == pytest.approx(sum(per_head) / 3)


def test_gpsa_reports_its_gate_and_centre_distance_per_head() -> None:
    """An attention kind's declared per-head reports (``head_report``) join the history and the epoch's report."""
    model = build_model(ModelConfig(encoding="gpsa", hidden=8, layers=2, heads=4, ffn=8), image_size=8)
    per_layer = measure_locality(model, torch.randn(3, 3, 8, 8))
    assert per_layer[0]["gate"] == pytest.approx([1 / (1 + math.exp(-1.0))] * 4)  # ConViT's init, lambda = 1
    assert per_layer[0]["centre_distance"][:4] == pytest.approx([math.sqrt(0.5)] * 4)  # the 2x2 grid of +-0.5
    summary = layer_summary(per_layer)
    assert summary[locality_key(2, "head3/gate")] == per_layer[1]["gate"][2]
    assert locality_key(1, "mean_distance") in summary and locality_key(1, "head1/mean_distance") not in summary
