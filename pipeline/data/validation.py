"""A validation set carved from the training set (``data.validation_fraction``), so the best epoch can be chosen
without looking at the test set.

Beyond the paper: the authors report the best test accuracy over epochs, an epoch chosen on the test set itself.
Per class, a fixed share of its training images (``round(fraction x count)``, halves up) is drawn by a seeded
permutation (``VALIDATION_SPLIT_SEED``) and moved to the validation set, so both sets keep the class balance and
the same params always give the same split. A fraction that would leave a class with no training or no validation
image is refused, naming ``data.validation_fraction``, before anything is written.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from pipeline.data.prepared import PreparedData

VALIDATION_SPLIT_SEED = 0


def validation_counts(labels: torch.Tensor, fraction: float, classes: tuple[str, ...]) -> dict[int, int]:
    """Per class present in ``labels``: how many of its images go to validation. Raises ``ValueError`` naming
    ``data.validation_fraction`` when a class would keep no training image or get no validation image."""
    counts = torch.bincount(labels, minlength=len(classes)).tolist()
    held_out = {c: math.floor(fraction * n + 0.5) for c, n in enumerate(counts) if n > 0}
    empty = [
        f"{classes[c]!r} ({counts[c]} images -> {k} validation)" for c, k in held_out.items() if not 0 < k < counts[c]
    ]
    if empty:
        raise ValueError(
            f"data.validation_fraction: {fraction} leaves a class with no training or no validation image: "
            f"{', '.join(empty)}; choose a fraction that keeps at least one image of every class on each side"
        )
    return held_out


def carve_validation(data: PreparedData, fraction: float) -> PreparedData:
    """``data`` with ``fraction`` of each class's training images moved to a validation set (both sets in their
    original order); unchanged when ``fraction`` is 0. Normalisation stays the caller's to recompute if it was
    measured on the training images."""
    if fraction == 0:
        return data
    held_out = validation_counts(data.train_labels, fraction, data.classes)
    generator = torch.Generator().manual_seed(VALIDATION_SPLIT_SEED)
    chosen = []
    for label, count in held_out.items():
        members = torch.nonzero(data.train_labels == label).flatten()  # (n_c,), ascending
        chosen.append(members[torch.randperm(len(members), generator=generator)[:count]])
    is_validation = torch.zeros(len(data.train_labels), dtype=torch.bool)
    is_validation[torch.cat(chosen)] = True
    return replace(
        data,
        train_images=data.train_images[~is_validation].contiguous(),
        train_labels=data.train_labels[~is_validation].contiguous(),
        val_images=data.train_images[is_validation].contiguous(),
        val_labels=data.train_labels[is_validation].contiguous(),
    )
