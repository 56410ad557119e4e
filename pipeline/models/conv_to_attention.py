"""Theorem 1 as executable code: a multi-head self-attention layer that *is* a given convolution.

Cordonnier et al. (ICLR 2020), Theorem 1: MHSA with ``Nh = K^2`` heads, ``Dh = Dout`` and a relative
positional encoding of dimension ``Dp >= 3`` expresses any ``K x K`` convolution. The construction:

- Lemma 1: head ``h`` attends (with probability ~1) to exactly one shift ``Delta_h`` of the kernel; its
  per-head value/output weight ``W(h)`` (column block h of ``MultiHeadSelfAttention.value``) is the kernel
  slice of that shift, ``conv.weight[:, :, i, j]`` (out x in); the value bias is the conv bias.
- Lemma 2: the quadratic score ``-alpha ||delta - Delta_h||^2`` (``QuadraticEncoding`` with spread
  ``s = sqrt(2 alpha)``) tends to a one-hot on ``delta = Delta_h`` as ``alpha -> infinity``. Every other key
  is at squared distance >= 1, so the leak is ``O(exp(-alpha))``: a finite alpha matches to machine precision.

Boundary handling follows the paper's remarks: attention is "SAME"-sized, so the input is zero-padded like
the conv, attention runs on the padded grid, and the output is cropped to the queries whose window fits (the
query is the window's anchor, its centre for odd K). Stride is a fixed subsampling after attention; dilation
puts the head centres on a dilated grid of shifts; a Conv1d is a ``1 x L`` grid with K heads (1D remark).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.quadratic import QuadraticEncoding

DEFAULT_ALPHA = 50.0  # leak exp(-50) ~ 2e-22 per neighbour: below float64 rounding for unit-scale inputs

Pair = tuple[int, int]


def _pair(value: tuple[int, ...], is_1d: bool) -> Pair:
    """A conv's per-dimension attribute as (rows, cols); a Conv1d is a single row."""
    return (1, value[0]) if is_1d else (value[0], value[1])


def _padding(conv: nn.Conv1d | nn.Conv2d, kernel: Pair, dilation: Pair) -> tuple[int, int, int, int]:
    """The conv's zero padding as ``F.pad``'s (left, right, top, bottom); 'same'/'valid' as PyTorch does."""
    if conv.padding == "valid":
        rows, cols = (0, 0), (0, 0)
    elif conv.padding == "same":  # total d*(k-1); an odd extra pixel goes to the end (right/bottom)
        totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        rows, cols = ((t // 2, t - t // 2) for t in totals)
    else:  # symmetric ints; the single row of a Conv1d is never padded
        pad = (0, *conv.padding) if isinstance(conv, nn.Conv1d) else tuple(conv.padding)
        rows, cols = (pad[0], pad[0]), (pad[1], pad[1])
    return (*cols, *rows)


class ConvAsAttention(nn.Module):
    """A K^2-head quadratic MHSA plus the fixed pad / crop / subsample that turn it into the convolution.

    Conv-shaped in and out: (B, C_in, H, W) -> (B, C_out, H', W'), or (B, C_in, L) -> (B, C_out, L').
    """

    def __init__(
        self,
        attention: MultiHeadSelfAttention,
        kernel: Pair,
        stride: Pair,
        dilation: Pair,
        padding: tuple[int, int, int, int],
        is_1d: bool,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.kernel, self.stride, self.dilation = kernel, stride, dilation
        self.padding, self.is_1d = padding, is_1d
        # The query of an output pixel is its window's anchor, (K-1)//2 dilated taps after the first tap.
        self.anchor = tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilation, strict=True))

    def forward(self, x: Tensor) -> Tensor:
        if self.is_1d:
            x = x.unsqueeze(2)  # (B, C, L) -> (B, C, 1, L)
        x = F.pad(x, self.padding)  # (B, C, Hp, Wp): attention is SAME-sized on the padded grid
        B, C, Hp, Wp = x.shape  # noqa: N806 (paper's symbols)
        tokens = x.flatten(2).transpose(1, 2)  # (B, Hp*Wp, C), row-major like relative_offsets
        # grid positional: forward pre-hooks (the trial's locality measurement) see it in ``args``
        out = self.attention(tokens, (Hp, Wp))  # (B, Hp*Wp, C_out)
        out = out.transpose(1, 2).reshape(B, -1, Hp, Wp)  # (B, C_out, Hp, Wp)
        # Keep the queries whose window fits in the padded grid, every stride-th one (fixed subsampling).
        geometry = zip(self.anchor, (Hp, Wp), self.kernel, self.dilation, self.stride, strict=True)
        rows, cols = (slice(a, a + (n - d * (k - 1) - 1) // s * s + 1, s) for a, n, k, d, s in geometry)
        out = out[:, :, rows, cols]  # (B, C_out, H', W')
        return out.squeeze(2) if self.is_1d else out


def attention_from_conv(conv: nn.Conv1d | nn.Conv2d, alpha: float = DEFAULT_ALPHA) -> ConvAsAttention:
    """The MHSA of Theorem 1 whose output equals ``conv(x)`` up to an ``O(exp(-alpha))`` leak."""
    if not isinstance(conv, nn.Conv1d | nn.Conv2d):
        raise TypeError(f"expected nn.Conv1d or nn.Conv2d, got {type(conv).__name__}")
    if conv.groups != 1:
        raise ValueError(f"groups={conv.groups} is not expressible: every head mixes all input channels")
    if conv.padding_mode != "zeros":
        raise ValueError(f"padding_mode={conv.padding_mode!r} is not expressible: only zero padding is")
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    is_1d = isinstance(conv, nn.Conv1d)
    kernel, stride, dilation = (_pair(v, is_1d) for v in (conv.kernel_size, conv.stride, conv.dilation))
    weight = conv.weight.detach()
    if is_1d:
        weight = weight.unsqueeze(2)  # (out, in, K) -> (out, in, 1, K)
    c_out, c_in, kh, kw = weight.shape

    encoding = QuadraticEncoding(kh * kw)
    attention = MultiHeadSelfAttention(encoding, c_in, c_out, bias=conv.bias is not None)
    attention.to(dtype=weight.dtype, device=weight.device)
    module = ConvAsAttention(attention, kernel, stride, dilation, _padding(conv, kernel, dilation), is_1d)
    with torch.no_grad():
        # Lemma 1: head h = i*Kw + j attends to tap (i, j), the shift (i*d_r, j*d_c) - anchor from the query.
        i, j = torch.meshgrid(torch.arange(kh), torch.arange(kw), indexing="ij")
        taps = torch.stack([i.flatten() * dilation[0], j.flatten() * dilation[1]], dim=-1)  # (H, 2)
        encoding.centres.copy_(taps - torch.tensor(module.anchor))
        encoding.spreads.fill_(math.sqrt(2.0 * alpha))  # Lemma 2: -1/2 s^2 = -alpha
        # W(h) = conv.weight[:, :, i, j]: the (out, in) column block h of value, for h = i*Kw + j.
        attention.value.weight.copy_(weight.permute(0, 2, 3, 1).reshape(c_out, kh * kw * c_in))
        if conv.bias is not None:
            attention.value.bias.copy_(conv.bias.detach())
    return module


def theorem_error_vs_alpha(conv: nn.Conv1d | nn.Conv2d, x: Tensor, alphas: list[float]) -> list[tuple[float, float]]:
    """(alpha, max |MHSA(x) - conv(x)|) per alpha: how fast the construction of Theorem 1 becomes exact."""
    with torch.no_grad():
        expected = conv(x)
        errors = [(attention_from_conv(conv, a)(x) - expected).abs().max().item() for a in alphas]
    return [(float(a), e) for a, e in zip(alphas, errors, strict=True)]
