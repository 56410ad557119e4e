"""Theorem 1 checked numerically: the constructed MHSA equals random float64 convolutions; it can fail."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.models.conv_to_attention import ConvAsAttention, attention_from_conv, theorem_error_vs_alpha

ATOL = 1e-5
# PyTorch forbids padding='same' with stride > 1, so those combinations are left out rather than skipped.
PADDINGS_2D, PADDINGS_1D = (0, 1, "same", "valid", (2, 1)), (0, 2, "same")
GEOMETRIES_2D = [(p, s, d) for p in PADDINGS_2D for s in (1, 2) for d in (1, 2) if p != "same" or s == 1]
GEOMETRIES_1D = [(p, s, d) for p in PADDINGS_1D for s, d in ((1, 1), (2, 1), (1, 2)) if p != "same" or s == 1]


def _conv2d(c_in: int, c_out: int, kernel, seed: int = 0, **kwargs) -> nn.Conv2d:
    torch.manual_seed(seed)
    return nn.Conv2d(c_in, c_out, kernel, **kwargs).double()


def _image(c_in: int, shape=(7, 9), seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, c_in, *shape, dtype=torch.float64)


def _assert_matches(conv: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        expected, got = conv(x), attention_from_conv(conv)(x)
    assert got.shape == expected.shape
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize(("c_in", "c_out"), [(1, 1), (3, 3), (3, 5), (4, 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_conv2d_same_padding(kernel: int, c_in: int, c_out: int, bias: bool) -> None:
    conv = _conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=bias)
    _assert_matches(conv, _image(c_in))


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize(("padding", "stride", "dilation"), GEOMETRIES_2D)
def test_matches_conv2d_geometry(kernel: int, padding, stride: int, dilation: int) -> None:
    conv = _conv2d(3, 4, kernel, padding=padding, stride=stride, dilation=dilation)
    _assert_matches(conv, _image(3, shape=(11, 13)))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")
@pytest.mark.parametrize("kernel", [(3, 5), (2, 3), (1, 3)])
@pytest.mark.parametrize("padding", [0, "same"])
def test_matches_non_square_kernel(kernel, padding) -> None:
    conv = _conv2d(2, 3, kernel, padding=padding)
    module = attention_from_conv(conv)
    assert module.attention.num_heads == kernel[0] * kernel[1]
    _assert_matches(conv, _image(2))


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize(("padding", "stride", "dilation"), GEOMETRIES_1D)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_conv1d(kernel: int, padding, stride: int, dilation: int, bias: bool) -> None:
    torch.manual_seed(0)
    conv = nn.Conv1d(3, 5, kernel, padding=padding, stride=stride, dilation=dilation, bias=bias).double()
    assert attention_from_conv(conv).attention.num_heads == kernel  # the paper's 1D remark: K heads
    x = torch.randn(2, 3, 17, dtype=torch.float64)
    _assert_matches(conv, x)


def test_heads_sit_on_the_kernel_grid() -> None:
    module = attention_from_conv(_conv2d(1, 1, 3, dilation=2), alpha=10.0)
    centres = module.attention.head_geometry()["centres"]
    expected = torch.tensor([[r, c] for r in (-2, 0, 2) for c in (-2, 0, 2)], dtype=torch.float64)
    torch.testing.assert_close(centres, expected)
    # alpha = s^2 / 2, and one-hot attention on the centre (Lemma 2): peak probability ~1 at alpha = 10.
    alpha = module.attention.encoding.spreads.square() / 2
    torch.testing.assert_close(alpha, torch.full((9,), 10.0, dtype=torch.float64))
    probs = module.attention.attention_map(query=(3, 3), grid=(7, 7))  # (9, 7, 7)
    assert probs.amax(dim=(1, 2)).min() > 0.999


# --- the check can fail -----------------------------------------------------------------------------


def test_too_small_alpha_does_not_match() -> None:
    conv = _conv2d(3, 4, 3, padding=1)
    x = _image(3)
    with torch.no_grad():
        error = (attention_from_conv(conv, alpha=0.1)(x) - conv(x)).abs().max().item()
    assert error > 0.1


def test_too_few_heads_does_not_match() -> None:
    conv = _conv2d(3, 4, 3, padding=1)
    x = _image(3)
    module: ConvAsAttention = attention_from_conv(conv)
    module.attention.prune_heads([h for h in range(9) if h != 4])  # drop the centre tap's head
    assert module.attention.num_heads == 8
    with torch.no_grad():
        error = (module(x) - conv(x)).abs().max().item()
    assert error > 0.1


def test_error_decreases_as_alpha_grows() -> None:
    conv = _conv2d(3, 4, 3, padding=1)
    alphas = [0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    curve = theorem_error_vs_alpha(conv, _image(3), alphas)
    assert [a for a, _ in curve] == alphas
    errors = [e for _, e in curve]
    assert all(later < earlier for earlier, later in zip(errors, errors[1:], strict=False))
    assert errors[0] > 0.1
    assert theorem_error_vs_alpha(conv, _image(3), [50.0])[0][1] < ATOL


@pytest.mark.parametrize(
    ("conv", "message"),
    [
        (nn.Conv2d(4, 4, 3, groups=2), "groups=2"),
        (nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
        (nn.Conv1d(4, 4, 3, groups=4), "groups=4"),
    ],
)
def test_rejects_what_attention_cannot_express(conv: nn.Module, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        attention_from_conv(conv)


def test_rejects_bad_alpha_and_type() -> None:
    with pytest.raises(ValueError, match="alpha"):
        attention_from_conv(nn.Conv2d(1, 1, 3), alpha=0.0)
    with pytest.raises(TypeError, match="Conv3d"):
        attention_from_conv(nn.Conv3d(1, 1, 3))
