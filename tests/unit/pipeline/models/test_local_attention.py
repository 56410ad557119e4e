"""Locality-truncated attention against the dense layer: equality at eps = 0, error <= eps * max|x|, fewer FLOPs,
gradients to the centres and spreads, pure shifts for one-pixel heads, and the config switch."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from pipeline.config import ConfigError, ModelConfig, parse_params
from pipeline.encodings import positional_encodings
from pipeline.models import build_model
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.generalized_quadratic import GeneralizedQuadraticEncoding
from pipeline.models.local_attention import (
    LocalMultiHeadSelfAttention,
    localise_attention,
    plan_windows,
    select_keys,
    window_flops,
)
from pipeline.models.positional import build_encoding
from pipeline.models.quadratic import QuadraticEncoding

GRID = (5, 6)
N = GRID[0] * GRID[1]
# alpha per head: broad, medium, and one-pixel heads (alpha = s^2 / 2), so every execution branch runs
ALPHAS = [0.5, 2.0, 6.0, 40.0, 60.0]
CENTRES = [[0.3, -0.2], [1.0, 1.0], [-1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]


def _quadratic(alphas=ALPHAS, centres=CENTRES) -> QuadraticEncoding:
    enc = QuadraticEncoding(len(alphas))
    with torch.no_grad():
        enc.centres.copy_(torch.tensor(centres))
        enc.spreads.copy_((2 * torch.tensor(alphas)).sqrt())
    return enc


def _generalized() -> GeneralizedQuadraticEncoding:
    torch.manual_seed(1)
    enc = GeneralizedQuadraticEncoding(4, spread_init_std=0.3)
    with torch.no_grad():
        enc.sqrt_sigma_inv.mul_(torch.tensor([0.7, 1.5, 3.0, 9.0])[:, None, None])
    return enc


def _pair(enc, eps: float, dropout: float = 0.0, in_dim: int = 3):
    """A dense layer and its truncated twin sharing every parameter."""
    torch.manual_seed(0)
    dense = MultiHeadSelfAttention(enc, in_dim=in_dim, out_dim=4, attention_dropout=dropout)
    return dense, LocalMultiHeadSelfAttention.from_dense(dense, eps)


def _heads_input(layer, x):
    """The (B, N, H*D) head outputs, i.e. the input of the layer's ``value`` Linear."""
    seen = []
    handle = layer.value.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    try:
        layer(x, GRID)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("name", positional_encodings())
def test_eps_zero_equals_dense_with_dropout(name: str) -> None:
    torch.manual_seed(0)
    enc = build_encoding(name, 4, max_grid=6, learned_dim=5, spread_init_std=0.2)
    dense, local = _pair(enc, eps=0.0, dropout=0.3)
    x = torch.randn(3, N, 3)
    torch.manual_seed(5)
    expected = dense(x, GRID)  # training mode: attention dropout on
    torch.manual_seed(5)
    torch.testing.assert_close(local(x, GRID), expected, rtol=1e-6, atol=1e-6)  # same dropout draws


@pytest.mark.parametrize("make", [_quadratic, _generalized], ids=["quadratic", "generalized"])
@pytest.mark.parametrize("eps", [1e-1, 1e-2, 1e-4])
def test_error_is_at_most_eps_times_max_input(make, eps: float) -> None:
    dense, local = _pair(make(), eps)
    dense.eval(), local.eval()
    x = torch.randn(4, N, 3)
    with torch.no_grad():
        error = (_heads_input(local, x) - _heads_input(dense, x)).abs().max()
    assert error <= eps * x.abs().max() + 1e-6
    assert local.plan(GRID).counts.float().mean() < N  # it did truncate


def test_windows_are_the_shortest_per_query() -> None:
    probs, eps = _quadratic().scores(GRID).softmax(-1).detach(), 1e-3
    needed, counts = select_keys(probs, eps)
    assert (needed.sum(-1) == counts).all()
    assert (1 - (probs * needed).sum(-1) <= eps + 1e-6).all()  # keeps >= 1 - eps of every row
    # dropping the least probable kept key leaves out more than eps: no shorter window would do
    smallest_kept = torch.where(needed, probs, torch.inf).amin(-1)
    assert (1 - (probs * needed).sum(-1) + smallest_kept > eps).all()


def test_one_pixel_heads_run_as_shifts_of_the_input() -> None:
    enc = _quadratic(alphas=[50.0, 50.0], centres=[[1.0, -1.0], [0.0, 2.0]])
    dense, local = _pair(enc, eps=1e-6)
    plan = local.plan(GRID)
    assert plan.shift_heads == [0, 1] and plan.window_heads == [] and plan.width == 0
    x = torch.randn(2, N, 3)
    heads = _heads_input(local.eval(), x).view(2, *GRID, 2, 3)  # (B, rows, cols, H, D)
    image = x.view(2, *GRID, 3)
    torch.testing.assert_close(heads[:, 0:4, 1:6, 0], image[:, 1:5, 0:5], rtol=0, atol=1e-5)  # x[q + (1, -1)]
    torch.testing.assert_close(heads[:, :, 0:4, 1], image[:, :, 2:6], rtol=0, atol=1e-5)  # x[q + (0, 2)]
    # at the borders the softmax keeps its mass inside the grid: the nearest pixel, as in the dense layer
    torch.testing.assert_close(heads[:, 4, 3, 0], image[:, 4, 2], rtol=0, atol=1e-5)
    torch.testing.assert_close(heads, _heads_input(dense.eval(), x).view(2, *GRID, 2, 3), rtol=0, atol=1e-5)


def test_flops_drop_and_match_the_formula() -> None:
    dense, local = _pair(_quadratic(), eps=1e-3, in_dim=8)
    x = torch.randn(2, N, 8)
    counts = []
    for layer in (dense, local):
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            layer(x, GRID)
        counts.append(counter.get_total_flops())
    linear = 2 * 2 * N * dense.value.in_features * dense.value.out_features
    plan = local.plan(GRID)
    assert counts[0] - linear == 2 * 2 * len(ALPHAS) * N * N * 8  # dense sums: 2 H N^2 D per image
    shift_part = N * len(plan.shift_heads) * 8  # elementwise: not seen by FlopCounterMode
    assert counts[1] - linear == 2 * (window_flops(plan, 8) - shift_part)
    assert counts[1] < counts[0]


@pytest.mark.parametrize("make", [_quadratic, _generalized], ids=["quadratic", "generalized"])
def test_gradients_reach_centres_and_spreads_and_match_dense(make) -> None:
    enc = make()
    dense, local = _pair(enc, eps=1e-6)
    x = torch.randn(2, N, 3)
    grads = []
    for layer in (dense, local):
        layer.zero_grad()
        layer(x, GRID).square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in layer.named_parameters()})
    for name in grads[0]:
        assert torch.isfinite(grads[1][name]).all()
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-3, atol=1e-4, msg=name)
    assert grads[1]["encoding.centres"].abs().sum() > 0


def test_autocast_bf16_on_cpu_stays_close_to_dense() -> None:
    dense, local = _pair(_quadratic(), eps=1e-4)
    x = torch.randn(2, N, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = dense(x, GRID), local(x, GRID)
    assert a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)


def test_model_config_switch_keeps_weights_and_state_dict_keys() -> None:
    small = dict(hidden=8, layers=2, ffn=12)
    torch.manual_seed(0)
    dense = build_model(ModelConfig(**small), image_size=12)
    torch.manual_seed(0)
    local = build_model(ModelConfig(**small, attention_window_eps=1e-4), image_size=12)
    assert all(isinstance(layer.attention, LocalMultiHeadSelfAttention) for layer in local.layers)
    assert not any(isinstance(layer.attention, LocalMultiHeadSelfAttention) for layer in dense.layers)
    for (name, a), (other, b) in zip(dense.state_dict().items(), local.state_dict().items(), strict=True):
        assert name == other
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # same seed, same weights: localising draws nothing
    images = torch.randn(2, 3, 12, 12)
    torch.testing.assert_close(local.eval()(images), dense.eval()(images), rtol=1e-3, atol=1e-3)


def test_config_field_defaults_to_dense_and_is_validated() -> None:
    assert ModelConfig().attention_window_eps is None
    assert parse_params({"model": {"attention_window_eps": 1e-6}}).model.attention_window_eps == 1e-6
    with pytest.raises(ConfigError, match="model.attention_window_eps"):
        parse_params({"model": {"attention_window_eps": -0.1}})
    resnet = build_model(ModelConfig(arch="resnet18", resnet_width=4, attention_window_eps=1e-3))
    assert not any(isinstance(m, LocalMultiHeadSelfAttention) for m in resnet.modules())  # ignored for a ResNet


def test_localised_model_can_be_pruned() -> None:
    model = localise_attention(build_model(ModelConfig(hidden=8, layers=2, ffn=12), image_size=12), 1e-4)
    model.prune_heads([[0, 3], [1, 2, 8]])
    assert model.heads_per_layer == [2, 3]
    assert model(torch.randn(1, 3, 12, 12)).shape == (1, 10)


def test_plan_of_one_pixel_heads_has_no_matmul() -> None:
    probs = torch.eye(4)[None].expand(2, 4, 4)  # two heads, each query attends to itself only
    plan = plan_windows(probs, 1e-6)
    assert plan.shift_heads == [0, 1] and plan.width == 0
    assert window_flops(plan, 3) == 2 * 4 * 3  # one multiply per element per head


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_truncated_equals_dense_on_cuda_under_bf16_autocast() -> None:
    dense, local = _pair(_quadratic(), eps=1e-4)
    dense, local = dense.cuda().eval(), local.cuda().eval()
    x = torch.randn(8, N, 3, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.testing.assert_close(local(x, GRID).float(), dense(x, GRID).float(), rtol=2e-2, atol=2e-2)
