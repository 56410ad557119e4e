"""Where the images come from: the paper's CIFAR-10 and an embedded offline stand-in, as ``PreparedData``.

- ``cifar10`` (the paper, Section 4): ``pipeline.data.cifar10``, torchvision's own loader on an existing archive or
  folder (never downloading), imported only when the params ask for CIFAR-10.
- ``digits``: scikit-learn's bundled handwritten digits (1797 8x8 grey images), resized and made RGB, so the whole
  pipeline runs offline on a laptop CPU. The split is stratified with a fixed seed recorded in the manifest.

Either dataset may then lose ``data.validation_fraction`` of each class's training images to a validation set
(``pipeline.data.validation``); the digits' normalisation is measured on the training images that remain.

Only the prepare stage needs this module (and scikit-learn, or torchvision); trials read ``pipeline.data.prepared``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from pipeline.config import DataConfig
from pipeline.data.prepared import PreparedData
from pipeline.data.validation import VALIDATION_SPLIT_SEED, carve_validation

log = logging.getLogger(__name__)

DIGITS_SPLIT_SEED = 0


def prepare_dataset(cfg: DataConfig, root: Path) -> PreparedData:
    """Build the configured dataset, with its validation set when ``data.validation_fraction`` asks for one; a
    relative ``cifar10_path`` resolves against ``root``."""
    if cfg.dataset == "digits":
        data = carve_validation(_prepare_digits(cfg), cfg.validation_fraction)
        if data.has_validation:  # the normalisation is the training images', as without a validation set
            mean, std = channel_stats(data.train_images)
            data = replace(data, mean=mean, std=std)
    elif cfg.dataset == "cifar10":
        from pipeline.data.cifar10 import prepare_cifar10  # torchvision: only for CIFAR-10

        path = Path(cfg.cifar10_path or "").expanduser()
        data = carve_validation(
            prepare_cifar10(path if path.is_absolute() else Path(root) / path, cfg), cfg.validation_fraction
        )
    else:
        raise ValueError(f"data.dataset: unknown dataset {cfg.dataset!r}; valid: ['cifar10', 'digits']")
    if data.val_labels is not None:
        log.info("held out %d of the training images as a validation set", len(data.val_labels))
    return data


# --- digits ---------------------------------------------------------------------------------------------------


def _prepare_digits(cfg: DataConfig) -> PreparedData:
    """sklearn's 8x8 digits (values 0..16) -> uint8 RGB at image_size, stratified split with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    grey = torch.from_numpy(digits.images).float().unsqueeze(1) * (255.0 / 16.0)  # (N, 1, 8, 8) in 0..255
    resized = F.interpolate(grey, size=(cfg.image_size, cfg.image_size), mode="bilinear", align_corners=False)
    images = resized.round().clamp(0, 255).to(torch.uint8).repeat(1, 3, 1, 1)  # (N, 3, S, S)
    labels = torch.from_numpy(digits.target).long()
    try:
        train_idx, test_idx = train_test_split(
            np.arange(len(labels)),
            test_size=cfg.test_fraction,
            stratify=digits.target,
            random_state=DIGITS_SPLIT_SEED,
        )
    except ValueError as err:  # e.g. too few test images to hold every class once
        raise ValueError(f"data.test_fraction: {cfg.test_fraction} cannot split the digits: {err}") from None
    train_idx, test_idx = torch.from_numpy(np.sort(train_idx)), torch.from_numpy(np.sort(test_idx))
    log.info("loaded %d digits (8x8 grey) from scikit-learn, resized to %dx%d RGB", len(labels), *images.shape[2:])
    mean, std = channel_stats(images[train_idx])
    return PreparedData(
        train_images=images[train_idx].contiguous(),
        train_labels=labels[train_idx].contiguous(),
        test_images=images[test_idx].contiguous(),
        test_labels=labels[test_idx].contiguous(),
        classes=tuple(str(name) for name in digits.target_names),
        mean=mean,
        std=std,
    )


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 (N, C, H, W) images scaled to [0, 1], from the train split only."""
    x = images.to(torch.float64).div(255.0).transpose(0, 1).reshape(images.shape[1], -1)  # (C, N*H*W)
    return tuple(round(v, 6) for v in x.mean(1).tolist()), tuple(round(v, 6) for v in x.std(1).tolist())


def provenance(cfg: DataConfig) -> dict:
    """How the split was made, for the manifest: the dataset, its split seed, whether MD5s were checked, and the
    validation split's fraction and seed when there is one (absent at 0, so that manifest is as before)."""
    validation = {}
    if cfg.validation_fraction > 0:
        validation = {"validation_fraction": cfg.validation_fraction, "validation_seed": VALIDATION_SPLIT_SEED}
    if cfg.dataset == "digits":
        return {
            "dataset": "digits",
            "source": "sklearn.datasets.load_digits",
            "split_seed": DIGITS_SPLIT_SEED,
            "test_fraction": cfg.test_fraction,
            **validation,
        }
    return {
        "dataset": "cifar10",
        "source": "torchvision.datasets.CIFAR10 (official split)",
        "split_seed": None,
        "checksum_verified": cfg.verify_checksum,
        **validation,
    }
