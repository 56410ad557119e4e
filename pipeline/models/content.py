"""Content attention beside the positional scores: the setting of Ramachandran et al. and Bello et al. (2019).

Beyond the paper, which computes its scores from positions only (Sec. 4.3, point iii). ``model.content: true`` adds
query-key scores to any encoding's positional scores before the softmax:

    scores_h(q, k) = positional_h(k - q) + <W_q(h) x_q, W_k(h) x_k> / sqrt(Dh)

with query and key projections at the head's width (Dh = the layer's input width: this model's heads run at full
width, App. A.4) and no bias (ConViT's ``qk``). The probabilities then differ per image, so the layer returns
(B, H, N, N) from ``probs_for``, and the trial's locality metrics are measured on those real probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import PositionalEncoding, head_linear


class ContentScores(nn.Module):
    """Per-head query-key scores ``q . k / sqrt(Dh)`` of the input, (B, N, D) -> (B, H, N, N), heads at width D."""

    def __init__(self, num_heads: int, in_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.in_dim = in_dim
        self.query = head_linear(in_dim, num_heads * in_dim, bias=False)  # W_q of every head, head-major blocks
        self.key = head_linear(in_dim, num_heads * in_dim, bias=False)  # W_k

    def forward(self, x: Tensor) -> Tensor:
        B, N, D = x.shape  # noqa: N806
        H = self.num_heads  # noqa: N806
        # The scale on q (B, H, N, D) rather than on the scores (B, H, N, N): half the elements, forward and backward
        # (the same scores up to rounding; tests/unit/pipeline/models/test_gpsa_fast_path.py: float64 within 1e-12).
        q = (self.query(x) * D**-0.5).view(B, N, H, D).transpose(1, 2)  # (B, H, N, D)
        k = self.key(x).view(B, N, H, D).transpose(1, 2)  # (B, H, N, D)
        return q @ k.transpose(-1, -2)  # (B, H, N, N)

    def prune(self, keep: list[int]) -> None:
        """Keep the query and key rows of the heads in ``keep``."""
        rows = torch.tensor([r for h in keep for r in range(h * self.in_dim, (h + 1) * self.in_dim)], dtype=torch.long)
        for name in ("query", "key"):
            old: nn.Linear = getattr(self, name)
            new = head_linear(self.in_dim, len(keep) * self.in_dim, bias=False).to(old.weight)
            with torch.no_grad():
                new.weight.copy_(old.weight[rows.to(old.weight.device)])
            setattr(self, name, new)
        self.num_heads = len(keep)


class ContentPositionSelfAttention(MultiHeadSelfAttention):
    """The attention layer with content scores added to the encoding's positional scores (``model.content: true``)."""

    reads_content = True

    def __init__(
        self,
        encoding: PositionalEncoding,
        in_dim: int,
        out_dim: int | None = None,
        attention_dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__(encoding, in_dim, out_dim, attention_dropout=attention_dropout, bias=bias)
        self.content = ContentScores(encoding.num_heads, in_dim)

    def probs_for(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """Per-image probabilities (B, H, N, N): softmax of positional plus content scores, at least float32."""
        positional = self.encoding.scores(grid)  # (H, N, N), shared by every image
        scores = positional[None] + self.content(x)  # (B, H, N, N)
        return scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(dim=-1)

    def prune_heads(self, keep: list[int]) -> None:
        super().prune_heads(keep)
        self.content.prune(sorted(keep))


__all__ = ["ContentPositionSelfAttention", "ContentScores"]
