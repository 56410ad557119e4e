"""Gaussian attention heads: a learned centre Delta per head and a precision ``Sigma^-1``, shared by the two quadratic
encodings (``quadratic``, ``generalized_quadratic``), which differ only in how they parametrise ``Sigma^-1``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.models.positional import PositionalEncoding


def keep_rows(param: nn.Parameter, keep: list[int]) -> nn.Parameter:
    """``param``'s rows ``keep`` (the heads a pruning keeps) as a new parameter."""
    return nn.Parameter(param.detach()[keep].clone(), requires_grad=param.requires_grad)


class GaussianEncoding(PositionalEncoding):
    """Shared by the two quadratic encodings: a learned centre Delta per head and a precision ``Sigma^-1``."""

    def __init__(self, num_heads: int, centre_init_std: float, max_grid: int | None = None) -> None:
        del max_grid  # a Gaussian's scores are defined on any grid
        super().__init__()
        self.num_heads = num_heads
        self.centres = nn.Parameter(torch.randn(num_heads, 2) * centre_init_std)  # Delta, (H, 2)

    def sigma_inv(self, dtype: torch.dtype | None = None) -> Tensor:  # (H, 2, 2), in ``dtype`` (default: the params')
        raise NotImplementedError

    def scores(self, grid: tuple[int, int]) -> Tensor:
        delta = self._offsets(grid, self.centres)  # (N, N, 2)
        diff = delta[None] - self.centres[:, None, None, :]  # (H, N, N, 2)
        # -1/2 (delta - Delta)^T Sigma^-1 (delta - Delta), per head and query/key pair
        return -0.5 * torch.einsum("hqki,hij,hqkj->hqk", diff, self.sigma_inv(), diff)

    def head_geometry(self) -> dict[str, Tensor]:
        """``Sigma^-1`` in float64: a stripe's small eigenvalue lies below float32's resolution of its large one, so
        ``S S^T`` in float32 gives condition numbers of 1e7-1e8 whatever the truth (and the pruning rule reads them)."""
        return {"centres": self.centres.detach(), "sigma_inv": self.sigma_inv(torch.float64).detach()}
