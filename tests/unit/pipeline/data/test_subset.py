"""train.data_fraction: a class-balanced, deterministic subset of the training set; the test set never shrinks."""

from __future__ import annotations

import pytest
import torch

from pipeline.data.prepared import PreparedData
from pipeline.data.subset import class_balanced_subset, kept_per_class, subset_size

COUNTS = (40, 25, 7, 1)  # uneven classes, one with a single image


def _data() -> PreparedData:
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(COUNTS)])
    labels = labels[torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(0))]  # classes interleaved
    images = torch.arange(labels.numel(), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).contiguous()
    return PreparedData(
        train_images=images,  # each image's pixels hold its index: what was kept can be read back
        train_labels=labels,
        test_images=torch.zeros(5, 3, 2, 2, dtype=torch.uint8),
        test_labels=torch.arange(5) % 4,
        classes=("a", "b", "c", "d"),
        mean=(0.5,) * 3,
        std=(0.25,) * 3,
    )


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.8])
def test_every_class_keeps_the_same_fraction(fraction: float) -> None:
    data = _data()
    subset = class_balanced_subset(data, fraction, seed=0)
    kept = torch.bincount(subset.train_labels, minlength=len(COUNTS)).tolist()
    assert kept == [max(1, round(fraction * n)) for n in COUNTS]
    assert len(subset.train_labels) == subset_size(data.train_labels, fraction)
    index = subset.train_images[:, 0, 0, 0].long()  # the kept images are the data's, with their own labels
    assert torch.equal(data.train_labels[index], subset.train_labels)
    assert torch.equal(index, index.sort().values)  # in the prepared order
    assert subset.test_images is data.test_images and subset.test_labels is data.test_labels


def test_the_draw_is_deterministic_per_seed_and_nested_across_fractions() -> None:
    data = _data()
    kept = {
        (fraction, seed): set(class_balanced_subset(data, fraction, seed).train_images[:, 0, 0, 0].tolist())
        for fraction in (0.25, 0.5)
        for seed in (0, 1)
    }
    assert kept[0.25, 0] == set(class_balanced_subset(data, 0.25, 0).train_images[:, 0, 0, 0].tolist())
    assert kept[0.25, 0] != kept[0.25, 1]  # another seed, another draw
    assert kept[0.25, 0] < kept[0.5, 0] and kept[0.25, 1] < kept[0.5, 1]  # one seed: a smaller fraction is inside


def test_all_the_data_is_the_data_itself() -> None:
    data = _data()
    assert class_balanced_subset(data, 1.0, seed=5) is data
    assert subset_size(data.train_labels, 1.0) == sum(COUNTS)


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_a_fraction_outside_zero_one_is_refused_naming_the_key(fraction: float) -> None:
    with pytest.raises(ValueError, match=r"train.data_fraction: .* outside \(0, 1\]"):
        class_balanced_subset(_data(), fraction, seed=0)
    with pytest.raises(ValueError, match="train.data_fraction"):
        kept_per_class(10, fraction)
