"""Gated positional self-attention (GPSA) of ConViT (d'Ascoli et al., ICML 2021, Sec. 3), on this paper's encoding.

Beyond the paper. ConViT starts each head as a convolution tap of *this* paper's quadratic encoding and lets it
escape: per head h,

    A_h = (1 - sigma(lambda_h)) softmax(content scores_h) + sigma(lambda_h) softmax(positional scores_h),

whose rows sum to 1 (ConViT renormalises them anyway; here that division is skipped). As in ConViT's code
(``GPSA``):

- **positional part**: the quadratic encoding (Eq. 9). ConViT's ``pos_proj`` on ``(dx, dy, dx^2 + dy^2)`` is a
  quadratic form; its ``local_init`` gives head ``h = h1 + k h2`` of a ``k x k`` grid (``k = floor(sqrt(H))``) the
  centre ``(h1 - c, h2 - c)`` (row, column shift; ``c`` the grid's middle) and the score
  ``-alpha ||delta - Delta_h||^2`` up to a per-head constant the softmax ignores, alpha = ``locality_strength``
  (ConViT's default 1.0). Here that is ``QuadraticEncoding`` with spread ``s = sqrt(2 alpha)``; heads beyond the
  ``k^2`` grid keep the encoding's random centres, as ConViT's keep ``pos_proj``'s random init.
- **gate**: ``lambda_h`` initialised to 1 (``gating_param``), so every head starts 73 % positional.
- **content part**: query/key projections without bias at the head's width, scaled by ``Dh^-1/2``
  (``pipeline.models.content``; this model's heads are full width, so Dh is the layer's input width).

Not taken from ConViT: its ``local_init`` also sets the value projection to the identity, which has no counterpart in
this model's full-width heads (one ``Linear(H * D, D)`` maps all heads); values keep PyTorch's initialisation, like
every layer here. Each epoch the layer reports, per head, the gate ``sigma(lambda_h)`` and the distance of the
positional centre from the query, ``||Delta_h||`` (``head_report``); the non-locality is the mean attention distance
every layer is measured by (``pipeline.trial.locality``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pipeline.models.content import ContentPositionSelfAttention
from pipeline.models.quadratic import QuadraticEncoding


def local_init_centres(num_heads: int) -> Tensor:
    """ConViT's ``local_init`` grid: head ``h1 + k h2`` at shift ``(h1 - c, h2 - c)``, (k^2, 2) for k = floor(sqrt(H)).

    ``c`` is the middle of ``0..k-1`` (a half-integer for even k, as in ConViT)."""
    k = math.isqrt(num_heads)
    centre = (k - 1) / 2
    h = torch.arange(k * k)
    return torch.stack([h % k - centre, h // k - centre], dim=-1).float()  # (k^2, 2): row shift, column shift


class GatedPositionalSelfAttention(ContentPositionSelfAttention):
    """ConViT's GPSA layer: quadratic positional heads started as a convolution, gated against content attention.

    Built as every attention layer here, on the encoding ``build_encoding`` makes (``pipeline.models.kinds``). Its
    content scores and their pruning are the content + position layer's; it mixes the two softmaxes instead of adding
    the scores (``probs_for``).
    """

    def __init__(
        self,
        encoding: QuadraticEncoding,
        in_dim: int,
        out_dim: int | None = None,
        attention_dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__(encoding, in_dim, out_dim, attention_dropout=attention_dropout, bias=bias)  # + content scores
        self.gating_param = nn.Parameter(torch.ones(encoding.num_heads))  # lambda_h (ConViT's name and init)

    @classmethod
    def build_encoding(
        cls, num_heads: int, *, max_grid: int, locality_strength: float = 1.0, centre_init_std: float = 2.0
    ) -> QuadraticEncoding:
        """The positional part at ConViT's ``local_init``: the first ``k^2`` heads on the grid of shifts, every spread
        ``sqrt(2 alpha)`` (``-s^2/2 ||.||^2 = -alpha ||.||^2``); heads beyond the grid keep random centres."""
        del max_grid  # the quadratic encoding works on any grid
        encoding = QuadraticEncoding(num_heads, centre_init_std=centre_init_std, spread_init_std=0.0)
        with torch.no_grad():
            grid = local_init_centres(num_heads)
            encoding.centres[: len(grid)] = grid
            encoding.spreads.fill_(math.sqrt(2.0 * locality_strength))
        return encoding

    def gate(self) -> Tensor:
        """``sigma(lambda_h)``, (H,): each head's weight on its positional attention."""
        return torch.sigmoid(self.gating_param)

    def probs_for(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """Per-image probabilities (B, H, N, N): the gated mix of content and positional attention."""
        positional = self.attention_probs(grid)  # (H, N, N), at least float32
        content = self.content(x)  # (B, H, N, N)
        content = content.to(torch.promote_types(content.dtype, positional.dtype)).softmax(dim=-1)
        gate = self.gate().to(positional.dtype)[:, None, None]  # (H, 1, 1)
        # g positional + (1 - g) content in one pass over (B, H, N, N), g positional formed on (H, N, N) first: its
        # gradient is then one sum over the batch, where lerp's backward made four passes over (B, H, N, N) (the same
        # mix up to rounding; tests/unit/pipeline/models/test_gpsa_fast_path.py). ConViT then divides by the row sums;
        # a convex mix of two softmaxes sums to 1 already, so that division only rounds, and it cost 13 % of a step.
        return torch.addcmul(gate * positional, content, 1 - gate)  # (B, H, N, N)

    def head_report(self) -> dict[str, Tensor]:
        """Per head (H,): ``gate`` = sigma(lambda_h), ``centre_distance`` = ||Delta_h|| in tokens."""
        return {"gate": self.gate().detach(), "centre_distance": self.encoding.centres.detach().norm(dim=-1)}

    def prune_heads(self, keep: list[int]) -> None:
        super().prune_heads(keep)  # the heads' encoding, values and content scores
        self.gating_param = nn.Parameter(self.gating_param.detach()[sorted(keep)].clone())


__all__ = ["GatedPositionalSelfAttention", "local_init_centres"]
