"""The paper's quadratic encoding (Eq. 9), isotropic Gaussian heads: ``-1/2 s^2 ||delta - Delta||^2``, alpha = s^2/2."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.models.gaussian import GaussianEncoding, keep_rows


class QuadraticEncoding(GaussianEncoding):
    """Isotropic Gaussian attention (Eq. 9): one centre and one spread ``s`` per head, ``Sigma^-1 = s^2 I``."""

    def __init__(
        self, num_heads: int, centre_init_std: float = 2.0, spread_init_std: float = 0.01, max_grid: int | None = None
    ) -> None:
        super().__init__(num_heads, centre_init_std, max_grid)
        self.spreads = nn.Parameter(1.0 + torch.randn(num_heads) * spread_init_std)  # s, (H,)

    def sigma_inv(self, dtype: torch.dtype | None = None) -> Tensor:
        spreads = self.spreads.to(dtype or self.spreads.dtype)
        eye = torch.eye(2, dtype=spreads.dtype, device=spreads.device)
        return spreads.square()[:, None, None] * eye  # (H, 2, 2)

    def scores(self, grid: tuple[int, int]) -> Tensor:
        # Same value as the generic quadratic form, without the 2x2 contraction.
        delta = self._offsets(grid, self.centres)  # (N, N, 2)
        sq_dist = (delta[None] - self.centres[:, None, None, :]).square().sum(-1)  # (H, N, N)
        return -0.5 * self.spreads.square()[:, None, None] * sq_dist

    def prune(self, keep: list[int]) -> None:
        self.centres = keep_rows(self.centres, keep)
        self.spreads = keep_rows(self.spreads, keep)
        self.num_heads = len(keep)
