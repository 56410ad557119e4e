"""A class-balanced fraction of the prepared training set (``train.data_fraction``, ConViT's ``--sampling_ratio``).

Every class keeps ``round(fraction x its images)`` of its training images (at least one), so the class balance of the
prepared set is kept; the test set is never touched. Which images a class keeps is drawn per class, in class order,
from a generator seeded with the trial's ``train.seed`` + 2**32: deterministic for a trial (its seed is part of its
identity), different between seeds (the spread over seeds includes the draw), and never the stream of the trial's own
shuffle generator (seeded with ``train.seed``). For one seed a smaller fraction keeps a subset of a larger one's
images: each class's draw is one permutation, of which a fraction keeps a prefix. The kept images stay in the
prepared order. A fraction of 1 returns the data itself: exactly the training a trial had before this option.

In every trial's code identity (``pipeline.trial.code_version``): light, torch only.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from pipeline.data.prepared import PreparedData

SUBSET_SEED_OFFSET = 2**32  # above every train.seed (< 2**32): the subset's stream is no trial's shuffle stream


def kept_per_class(count: int, fraction: float) -> int:
    """How many of a class's ``count`` training images a fraction keeps: the nearest count, at least one."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"train.data_fraction: {fraction} is outside (0, 1]")
    return max(1, round(fraction * count)) if count else 0


def subset_size(train_labels: torch.Tensor, fraction: float) -> int:
    """The number of training images ``class_balanced_subset`` keeps: what a run logs as ``train_images``."""
    return sum(kept_per_class(int(count), fraction) for count in torch.bincount(train_labels).tolist())


def class_balanced_subset(data: PreparedData, fraction: float, seed: int) -> PreparedData:
    """``data`` with ``fraction`` of every class's training images, drawn from ``seed`` (see the module docstring)."""
    if fraction == 1.0:
        kept_per_class(1, fraction)  # the same refusal of bad values on every path
        return data
    generator = torch.Generator().manual_seed(seed + SUBSET_SEED_OFFSET)
    kept = []
    for label in range(data.num_classes):
        members = torch.nonzero(data.train_labels == label).flatten()  # (n_c,) in prepared order
        order = torch.randperm(members.numel(), generator=generator)
        kept.append(members[order[: kept_per_class(members.numel(), fraction)]])
    index = torch.cat(kept).sort().values  # (K,): the prepared order
    return replace(data, train_images=data.train_images[index], train_labels=data.train_labels[index])


__all__ = ["SUBSET_SEED_OFFSET", "class_balanced_subset", "kept_per_class", "subset_size"]
