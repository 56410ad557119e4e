"""The interface of the relative positional encodings that *are* the attention scores (Cordonnier et al., Sec. 3-4).

Each encoding owns its per-head parameters and returns per-head scores over relative shifts
``delta = key - query`` on a 2D grid of tokens, shape (H, N, N) with N = rows * cols. Scores depend on positions
only, never on the content of the pixels (point (iii) of Sec. 4.3), so one (H, N, N) tensor serves a whole batch.

Each encoding is one class in a module of its own, registered with the config fields it takes in
``pipeline.encodings.ENCODINGS``: ``quadratic`` (Eq. 9), ``generalized_quadratic`` (App. A.1, both on ``gaussian``'s
shared Gaussian heads) and ``learned`` (Sec. 4.3). Adding an encoding means adding a module and one entry there; the
attention layer does not change, and a trial's code identity counts only its own encoding's module
(``pipeline.trial.code_version``). An encoding is built as ``cls(num_heads, max_grid=..., **its declared fields)``.
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


def build_encoding(name: str, num_heads: int, *, max_grid: int, **fields: object) -> PositionalEncoding:
    """The positional encoding called ``name``. ``fields`` may hold any encoding's config fields (a model config's):
    it takes those its registry entry declares, with their declared defaults for any not given."""
    spec = spec_for(name)
    if spec.attention:
        raise ValueError(f"{name!r} is an attention kind, not a positional encoding")
    return spec.load()(num_heads, max_grid=max_grid, **spec.own_fields(fields))
