"""The authors' computational pattern for Gaussian attention, as a drop-in layer: the baseline of the GPU ratio.

The authors' code (``GaussianSelfAttention`` in their ``models/bert.py``) computes the same function as
``pipeline.models.attention.MultiHeadSelfAttention`` another way, and this module restates that way so that the
speed-up of our paths is measured against it on the same GPU, in the same run:

- a buffer ``R`` of (rows, cols, rows, cols, 5) relative-position features ``[dr, dc, dr^2, dc^2, dr*dc]`` and one
  5-vector per head from its centre and ``Sigma^-1``; the scores are ``einsum('ijkld,hd->ijhkl', R, u)`` (the
  quadratic form less its per-head constant ``Delta^T Sigma^-1 Delta``, which the softmax ignores);
- softmax over the keys, dropout on the (rows, cols, H, rows, cols) probabilities;
- ``einsum('ijhkl,bkld->bijhd', probs, x)`` on the image-shaped input, then the heads' ``Linear``;
- float32 throughout: the authors trained without mixed precision.

The layer shares the encoding, ``value`` and dropout of the layer it replaces, so a model keeps its weights and
computes the same logits (a test checks it in float64). Only Gaussian encodings: the learned encoding's pattern is
another code path of theirs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import relative_offsets


class AuthorsPatternAttention(nn.Module):
    """``layer``'s function computed as the authors' code computes it (see the module docstring)."""

    def __init__(self, layer: MultiHeadSelfAttention) -> None:
        super().__init__()
        if layer.head_geometry() is None:
            raise ValueError("the authors' pattern is defined for Gaussian encodings only")
        self.encoding = layer.encoding
        self.value = layer.value
        self.attention_dropout = layer.attention_dropout
        self._features: dict[tuple, Tensor] = {}

    def relative_features(self, grid: tuple[int, int], like: Tensor) -> Tensor:
        """``R``: (rows, cols, rows, cols, 5), key minus query, built once per grid as the authors' buffer is."""
        key = (grid, like.device, like.dtype)
        if key not in self._features:
            delta = relative_offsets(*grid, device=like.device).to(like.dtype)  # (N, N, 2)
            dr, dc = delta[..., 0], delta[..., 1]
            features = torch.stack([dr, dc, dr.square(), dc.square(), dr * dc], dim=-1)  # (N, N, 5)
            self._features = {key: features.view(*grid, *grid, 5)}
        return self._features[key]

    def head_vectors(self) -> Tensor:
        """Per head, the 5 coefficients of ``-1/2 (delta - Delta)^T Sigma^-1 (delta - Delta)`` on ``R``'s features,
        without the constant term: (H, 5)."""
        sigma_inv = self.encoding.sigma_inv()  # (H, 2, 2)
        a, b, c = sigma_inv[:, 0, 0], sigma_inv[:, 0, 1], sigma_inv[:, 1, 1]
        mu_r, mu_c = self.encoding.centres[:, 0], self.encoding.centres[:, 1]
        linear_r, linear_c = a * mu_r + b * mu_c, c * mu_c + b * mu_r
        return torch.stack([linear_r, linear_c, -a / 2, -c / 2, -b], dim=-1)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        B, N, D = x.shape  # noqa: N806
        rows, cols = grid
        H = self.encoding.num_heads  # noqa: N806
        scores = torch.einsum("ijkld,hd->ijhkl", self.relative_features(grid, x), self.head_vectors())
        probs = scores.reshape(rows, cols, H, N).softmax(dim=-1).view(rows, cols, H, rows, cols)
        probs = self.attention_dropout(probs)
        mixed = torch.einsum("ijhkl,bkld->bijhd", probs, x.view(B, rows, cols, D))  # (B, rows, cols, H, D)
        return self.value(mixed.reshape(B, N, H * D))


def use_authors_pattern(model: nn.Module) -> int:
    """Replace every Gaussian attention layer of ``model`` by its authors'-pattern equivalent, in place; returns how
    many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, MultiHeadSelfAttention) and child.head_geometry() is not None:
                setattr(parent, name, AuthorsPatternAttention(child))
                replaced += 1
    return replaced
