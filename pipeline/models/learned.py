"""The learned relative encoding (Sec. 4.3): a head vector dotted with learned row-shift and column-shift embeddings."""

from __future__ import annotations

from torch import Tensor, nn

from pipeline.models.positional import PositionalEncoding, head_linear


class LearnedRelativeEncoding(PositionalEncoding):
    """Learned relative positions (Sec. 4.3): score = w_row(h) . E_row[dr] + w_col(h) . E_col[dc].

    As in the authors' code, each half embeds shifts in ``-(G-1)..(G-1)`` with ``learned_dim`` features (400 each), and
    a bias-free ``Linear(learned_dim, H)`` per half holds the heads' query-side vectors.
    """

    def __init__(self, num_heads: int, max_grid: int, learned_dim: int = 400) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.max_grid = max_grid
        self.row_embedding = nn.Embedding(2 * max_grid - 1, learned_dim)
        self.col_embedding = nn.Embedding(2 * max_grid - 1, learned_dim)
        self.row_heads = head_linear(learned_dim, num_heads, bias=False)
        self.col_heads = head_linear(learned_dim, num_heads, bias=False)

    def scores(self, grid: tuple[int, int]) -> Tensor:
        if max(grid) > self.max_grid:
            raise ValueError(f"grid {grid} exceeds the learned encoding's max_grid={self.max_grid}")
        shift = self._offsets(grid, self.row_embedding.weight).long() + (self.max_grid - 1)  # (N, N, 2), >= 0
        row_logits = self.row_heads(self.row_embedding.weight)  # (2G-1, H): one score per head and row shift
        col_logits = self.col_heads(self.col_embedding.weight)  # (2G-1, H)
        scores = row_logits[shift[..., 0]] + col_logits[shift[..., 1]]  # (N, N, H)
        return scores.permute(2, 0, 1)  # (H, N, N)

    def prune(self, keep: list[int]) -> None:
        for name in ("row_heads", "col_heads"):
            old: nn.Linear = getattr(self, name)
            new = head_linear(old.in_features, len(keep), bias=False).to(old.weight)
            new.weight.data.copy_(old.weight.data[keep])
            setattr(self, name, new)
        self.num_heads = len(keep)
