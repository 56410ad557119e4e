"""Speed helpers and the equality of each optimised training path with the plain fp32 one (no timing asserts).

Covered elsewhere: batched probabilities == per-image loop (test_attention.py), on-device augmentation and
``train.compile`` == eager (test_train.py, the latter marked slow), truncated attention (test_local_attention.py),
CUDA graphs == eager (test_loop.py, on a GPU only).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from pipeline.config import PAPER_VARIANTS, ModelConfig, TrainConfig
from pipeline.measure.counting import count_flops
from pipeline.measure.speed import (
    count_training_flops,
    matmul_peak_flops,
    peak_memory_bytes,
    set_gaussian_heads,
)
from pipeline.models import build_model
from pipeline.trial.device_data import DeviceData
from pipeline.trial.loop import build_optimizer, evaluate

SMALL = ModelConfig(hidden=16, layers=2, ffn=24, learned_dim=8, resnet_width=4, dropout=0.0, attention_dropout=0.0)


def _batch(n: int = 6, size: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=generator), torch.randint(0, 10, (n,), generator=generator)


def test_matmul_peak_is_a_positive_rate() -> None:
    flops = matmul_peak_flops(torch.device("cpu"), size=64, repeats=2)
    assert math.isfinite(flops) and flops > 0


def test_training_flops_of_a_linear_layer_are_forward_plus_weight_gradient() -> None:
    layer = nn.Linear(12, 10)
    images = torch.randn(5, 12)  # the input needs no gradient: backward computes the weight gradient only
    flops = count_training_flops(layer, images, torch.randint(0, 10, (5,)))
    assert flops == 2 * (2 * 5 * 12 * 10)
    assert layer.weight.grad is None  # cleared afterwards


def test_training_flops_of_a_model_are_two_to_three_forwards() -> None:
    torch.manual_seed(0)
    model = build_model(SMALL, image_size=8)
    images, labels = _batch()
    forward = count_flops(model, (3, 8, 8)).full * len(labels)
    training = count_training_flops(model, images, labels)
    assert 2 * forward < training <= 3 * forward


def test_peak_memory_is_not_tracked_on_the_cpu() -> None:
    assert peak_memory_bytes(torch.device("cpu")) is None


@pytest.mark.parametrize("encoding", ["quadratic", "generalized_quadratic"])
def test_trained_like_heads_have_the_papers_peak(encoding: str) -> None:
    model = build_model(SMALL.model_copy(update={"encoding": encoding, "heads": 9}), image_size=16)
    assert set_gaussian_heads(model, 10.0) == 2
    maps = model.layers[0].attention.attention_map((4, 4), (8, 8))  # (H, rows, cols)
    centres = [(4 + r, 4 + c) for r in (-1, 0, 1) for c in (-1, 0, 1)]  # a 3x3 grid around the query
    for h, (r, c) in enumerate(centres):
        assert maps[h, r, c] > 0.9998  # alpha = 10: the paper's oracle


def _train_step(model: nn.Module, images, labels, amp: torch.dtype | None, device_type: str = "cpu") -> float:
    optimizer = build_optimizer(model, TrainConfig(lr=0.1))
    with torch.autocast(device_type, dtype=amp or torch.float32, enabled=amp is not None):
        logits = model(images)
    loss = F.cross_entropy(logits.float(), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.mark.parametrize("name", ["quadratic", "learned"])
def test_bf16_autocast_step_matches_fp32_and_keeps_fp32_master_weights(name: str) -> None:
    """The optimised path's precision (bf16 autocast, fp32 weights), run on the CPU's bf16 autocast."""
    images, labels = _batch()
    losses, weights = [], []
    for amp in (None, torch.bfloat16):
        torch.manual_seed(0)
        model = build_model(SMALL.model_copy(update={"encoding": name}), image_size=8)
        losses.append(_train_step(model, images, labels, amp))
        assert all(p.dtype == torch.float32 for p in model.parameters())
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)  # bf16 has 8 bits of mantissa
    torch.testing.assert_close(weights[1], weights[0], rtol=0, atol=5e-3)


def test_large_eval_batches_give_the_same_metrics_as_small_ones() -> None:
    torch.manual_seed(0)
    model = build_model(SMALL, image_size=8)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (23, 3, 8, 8), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (23,), generator=generator)
    stats = [torch.full((1, 3, 1, 1), v) for v in (0.5, 0.25)]
    data = DeviceData(images, labels, images, labels, *stats)
    small = evaluate(model, images, labels, data, 4, None)
    large = evaluate(model, images, labels, data, 500, None)
    assert large[0] == pytest.approx(small[0], rel=1e-5) and large[1] == small[1]


def test_truncated_training_step_matches_the_plain_one() -> None:
    """The truncated path (trained-like heads, eps 1e-6) against exact attention: same loss, same update."""
    images, labels = _batch(size=16)
    losses, weights = [], []
    for eps in (None, 1e-6):
        torch.manual_seed(0)
        model = build_model(SMALL.model_copy(update={"heads": 9, "attention_window_eps": eps}), image_size=16)
        set_gaussian_heads(model, (1.0, 10.0), jitter=0.1)
        losses.append(_train_step(model, images, labels, None))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-4, atol=1e-5)


def test_channels_last_training_step_matches_the_plain_one() -> None:
    """benchmarks.train_throughput's channels_last path (ResNet18's weights, and so its activations, in NHWC layout)
    against the contiguous model: same loss, same update, up to float rounding."""
    images, labels = _batch(size=16)
    losses, weights = [], []
    for layout in (torch.contiguous_format, torch.channels_last):
        torch.manual_seed(0)
        model = build_model(SMALL.model_copy(update={"arch": "resnet18"}), image_size=16).to(memory_format=layout)
        losses.append(_train_step(model, images, labels, None))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(PAPER_VARIANTS))
def test_every_sweep_model_compiles_to_one_graph(name: str) -> None:
    """train.compile pays only if TorchDynamo captures the whole forward: a graph break (a Python-side cache, a
    data-dependent branch) would split it and put the interpreter back between kernels."""
    import torch._dynamo as dynamo

    model = build_model(PAPER_VARIANTS[name].apply(SMALL), image_size=16).train()
    dynamo.reset()
    try:
        explained = dynamo.explain(model)(torch.randn(2, 3, 16, 16))
    finally:
        dynamo.reset()
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_step_matches_cpu_fp32() -> None:
    images, labels = _batch()
    torch.manual_seed(0)
    reference = _train_step(build_model(SMALL, image_size=8), images, labels, None)
    torch.manual_seed(0)
    model = build_model(SMALL, image_size=8).cuda()
    loss = _train_step(model, images.cuda(), labels.cuda(), torch.bfloat16, "cuda")
    assert loss == pytest.approx(reference, rel=2e-2)
    assert peak_memory_bytes(torch.device("cuda")) > 0
