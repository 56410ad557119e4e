"""The generalized quadratic encoding (App. A.1, Eq. 16): ``-1/2 (delta - Delta)^T Sigma^-1 (delta - Delta)`` with
``Sigma^-1 = S S^T``, so Sigma stays positive semi-definite."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.models.gaussian import GaussianEncoding, keep_rows


class GeneralizedQuadraticEncoding(GaussianEncoding):
    """Non-isotropic Gaussian attention (App. A.1): ``Sigma^-1 = S S^T`` with a learned 2x2 ``S`` per head."""

    def __init__(
        self, num_heads: int, centre_init_std: float = 2.0, spread_init_std: float = 0.01, max_grid: int | None = None
    ) -> None:
        super().__init__(num_heads, centre_init_std, max_grid)
        self.sqrt_sigma_inv = nn.Parameter(torch.eye(2) + torch.randn(num_heads, 2, 2) * spread_init_std)  # S

    def sigma_inv(self, dtype: torch.dtype | None = None) -> Tensor:
        s = self.sqrt_sigma_inv.to(dtype or self.sqrt_sigma_inv.dtype)  # (H, 2, 2)
        return s @ s.transpose(-1, -2)  # (H, 2, 2)

    def prune(self, keep: list[int]) -> None:
        self.centres = keep_rows(self.centres, keep)
        self.sqrt_sigma_inv = keep_rows(self.sqrt_sigma_inv, keep)
        self.num_heads = len(keep)
