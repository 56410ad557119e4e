"""Relative positional encodings that *are* the attention scores (Cordonnier et al. 2020, Sec. 3-4).

Each encoding owns its per-head parameters and returns per-head scores over relative shifts
``delta = key - query`` on a 2D grid of tokens, shape (H, N, N) with N = rows * cols. Scores depend on positions
only, never on the content of the pixels (point (iii) of Sec. 4.3), so one (H, N, N) tensor serves a whole batch.

- ``QuadraticEncoding`` (Eq. 9, isotropic Gaussian): ``-1/2 s^2 ||delta - Delta||^2`` (the paper's alpha = s^2 / 2).
- ``GeneralizedQuadraticEncoding`` (App. A.1, Eq. 16): ``-1/2 (delta - Delta)^T Sigma^-1 (delta - Delta)`` with
  ``Sigma^-1 = S S^T`` so Sigma stays positive semi-definite.
- ``LearnedRelativeEncoding`` (Sec. 4.3): a head vector dotted with learned row-shift and column-shift embeddings.

Each class is registered, with the config fields it takes, in ``pipeline.encodings.ENCODINGS``; adding an encoding
means adding a class (here or in a module of its own) and one entry there, and the attention layer does not change.
An encoding is built as ``cls(num_heads, max_grid=..., **its declared fields)``.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from pipeline.encodings import spec_for


def relative_offsets(rows: int, cols: int, device: torch.device | None = None) -> Tensor:
    """``delta[q, k] = pos(k) - pos(q)`` for every query/key pair of a rows x cols grid, shape (N, N, 2).

    Built for the actual grid (no oversized offset tables). Row-major token order, matching ``flatten(1, 2)``.
    """
    r, c = torch.meshgrid(torch.arange(rows, device=device), torch.arange(cols, device=device), indexing="ij")
    pos = torch.stack([r.flatten(), c.flatten()], dim=-1)  # (N, 2)
    return pos[None, :, :] - pos[:, None, :]  # (N, N, 2): key minus query


def head_linear(in_features: int, out_features: int, *, bias: bool = True) -> nn.Linear:
    """``nn.Linear`` with one side sized by the head count, which may be 0 (a layer pruned to no heads).

    Only silences torch's warning that initialising the empty weight is a no-op: there is nothing to initialise.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
        return nn.Linear(in_features, out_features, bias=bias)


class PositionalEncoding(nn.Module):
    """Interface: per-head relative-position scores, and (for Gaussian heads) their geometry.

    ``prune(keep)`` removes heads in place so that pruning never needs to know how an encoding stores them.
    """

    num_heads: int

    def scores(self, grid: tuple[int, int]) -> Tensor:  # (H, N, N)
        raise NotImplementedError

    def head_geometry(self) -> dict[str, Tensor] | None:
        """``{"centres": (H, 2), "sigma_inv": (H, 2, 2)}`` for Gaussian heads, None for the learned encoding."""
        return None

    def prune(self, keep: list[int]) -> None:
        raise NotImplementedError

    def _offsets(self, grid: tuple[int, int], like: Tensor) -> Tensor:
        """Relative offsets for ``grid`` as ``like``'s dtype/device, cached because every forward needs them."""
        if torch.compiler.is_compiling():
            # Part of the compiled graph instead: torch 2.11's Dynamo breaks the graph on the cache's
            # ``__dict__.setdefault``, and a CUDA-graphed step split into pieces failed in training (H200).
            return relative_offsets(*grid, device=like.device).to(like.dtype)
        cache = self.__dict__.setdefault("_offset_cache", {})
        key = (grid, like.device, like.dtype)
        if key not in cache:
            cache.clear()  # one grid at a time in practice; keep the cache from growing across devices/dtypes
            cache[key] = relative_offsets(*grid, device=like.device).to(like.dtype)
        return cache[key]


def _keep_rows(param: nn.Parameter, keep: list[int]) -> nn.Parameter:
    return nn.Parameter(param.detach()[keep].clone(), requires_grad=param.requires_grad)


class _GaussianEncoding(PositionalEncoding):
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


class QuadraticEncoding(_GaussianEncoding):
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
        self.centres = _keep_rows(self.centres, keep)
        self.spreads = _keep_rows(self.spreads, keep)
        self.num_heads = len(keep)


class GeneralizedQuadraticEncoding(_GaussianEncoding):
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
        self.centres = _keep_rows(self.centres, keep)
        self.sqrt_sigma_inv = _keep_rows(self.sqrt_sigma_inv, keep)
        self.num_heads = len(keep)


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


def build_encoding(name: str, num_heads: int, *, max_grid: int, **fields: object) -> PositionalEncoding:
    """The positional encoding called ``name``. ``fields`` may hold any encoding's config fields (a model config's):
    it takes those its registry entry declares, with their declared defaults for any not given."""
    spec = spec_for(name)
    if spec.attention:
        raise ValueError(f"{name!r} is an attention kind, not a positional encoding")
    return spec.load()(num_heads, max_grid=max_grid, **spec.own_fields(fields))
