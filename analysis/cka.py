"""Linear CKA (Kornblith et al., ICML 2019): how alike two layers' representations of the same images are.

For representations ``X`` (n x p) and ``Y`` (n x q) of the same n images, features centred over the images,

    CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) = <K, L> / (||K||_F ||L||_F),  K = X X^T, L = Y Y^T,

computed here in the n x n Gram form, which is cheaper when a layer has more features than there are images (a token
layer's 64 tokens x 32 channels). It is 1 for a representation and itself, and invariant to an orthogonal transform
of either side's features and to scaling it (the tests check all three), so it compares what two networks represent,
not how their units happen to be arranged: Raghu et al. (NeurIPS 2021) compare ViTs with ResNets this way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def centred_gram(features: Tensor) -> Tensor:
    """``K = X X^T`` of the features centred over the images, normalised to unit Frobenius norm: (n, n) float64.
    ``features`` is (n, ...) and flattened per image; a constant representation has no direction and gives NaN."""
    x = features.flatten(1).double()  # (n, p)
    x = x - x.mean(dim=0, keepdim=True)
    gram = x @ x.T  # (n, n)
    return gram / gram.norm()


def linear_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA between two representations of the same images, (n, ...) each."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA compares representations of the same images: {x.shape[0]} vs {y.shape[0]}")
    return float((centred_gram(x) * centred_gram(y)).sum())


def cka_matrix(rows: Sequence[Tensor], columns: Sequence[Tensor]) -> np.ndarray:
    """CKA of every row representation with every column one, from their ``centred_gram``s: (len(rows),
    len(columns))."""
    return np.array([[float((k * g).sum()) for g in columns] for k in rows])


@torch.no_grad()
def layer_grams(model: torch.nn.Module, modules: Sequence[torch.nn.Module], images: Tensor) -> list[Tensor]:
    """The ``centred_gram`` of what each of ``modules`` (parts of ``model``) outputs when ``model`` (eval mode) runs
    on ``images``. Formed as each layer runs, so only n x n matrices are kept, not every layer's features."""
    grams: dict[int, Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda mod, _, out: grams.__setitem__(id(mod), centred_gram(out))) for m in modules
    ]
    try:
        model.eval()(images)
    finally:
        for hook in hooks:
            hook.remove()
    return [grams[id(m)] for m in modules]


def representations(model: torch.nn.Module) -> tuple[list[str], list[torch.nn.Module]]:
    """The layers a model's representations are read from, with their names: a self-attention classifier's
    transformer layers (token features, ``layer 1`` ...), a ResNet's stem and four stages (feature maps)."""
    if hasattr(model, "stages"):  # ResNet18 and its attention rebuild
        return ["stem", *[f"stage {i}" for i in range(1, len(model.stages) + 1)]], [model.stem, *model.stages]
    return [f"layer {i}" for i in range(1, len(model.layers) + 1)], list(model.layers)


__all__ = ["centred_gram", "cka_matrix", "layer_grams", "linear_cka", "representations"]
