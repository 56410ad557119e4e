"""Where the images come from: the paper's CIFAR-10 and an embedded offline stand-in, as ``PreparedData``.

- ``cifar10`` (the paper, Section 4): read by torchvision's own ``CIFAR10`` loader (never downloading) from an
  existing ``cifar-10-python.tar.gz`` or its extracted ``cifar-10-batches-py/`` folder, checked against torchvision's
  published MD5s unless ``verify_checksum`` is explicitly off (tests write a tiny archive in the real format).
- ``digits``: scikit-learn's bundled handwritten digits (1797 8x8 grey images), resized and made RGB, so the whole
  pipeline runs offline on a laptop CPU. The split is stratified with a fixed seed recorded in the manifest.

Only the prepare stage needs this module (and torchvision / scikit-learn); trials read ``pipeline.data.prepared``.
"""

from __future__ import annotations

import logging
import pickle
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import check_integrity, extract_archive

from pipeline.config import DataConfig
from pipeline.data.prepared import PreparedData

log = logging.getLogger(__name__)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
# The paper's normalisation (authors' code, from the usual CIFAR-10 recipe).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR10_SIZE = 32
DIGITS_SPLIT_SEED = 0


def prepare_dataset(cfg: DataConfig, root: Path) -> PreparedData:
    """Build the configured dataset; a relative ``cifar10_path`` resolves against ``root``."""
    if cfg.dataset == "digits":
        return _prepare_digits(cfg)
    if cfg.dataset == "cifar10":
        path = Path(cfg.cifar10_path or "").expanduser()
        return _prepare_cifar10(path if path.is_absolute() else Path(root) / path, cfg)
    raise ValueError(f"data.dataset: unknown dataset {cfg.dataset!r}; valid: ['cifar10', 'digits']")


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


# --- cifar10 --------------------------------------------------------------------------------------------------


def _prepare_cifar10(path: Path, cfg: DataConfig) -> PreparedData:
    """Read both splits with torchvision's loader from an archive or extracted folder; never downloads."""
    with _cifar10_root(path, cfg.verify_checksum) as root:
        loader = CIFAR10 if cfg.verify_checksum else _unverified_cifar10()
        try:
            train, test = loader(root, train=True, download=False), loader(root, train=False, download=False)
        except (RuntimeError, pickle.UnpicklingError, EOFError) as err:  # "not found or corrupted", bad pickles
            raise ValueError(f"{path}: torchvision could not read CIFAR-10 ({err}); {_how_to_get()}") from None
    check = "MD5 verified" if cfg.verify_checksum else "checksum NOT verified (data.verify_checksum: false)"
    log.info("loaded CIFAR-10 from %s: %d train, %d test images, %s", path, len(train), len(test), check)
    images = [torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous() for ds in (train, test)]  # HWC -> CHW
    if cfg.image_size != CIFAR10_SIZE:
        log.warning("resizing CIFAR-10 from 32x32 to %dx%d (the paper uses 32x32)", cfg.image_size, cfg.image_size)
        images = [_resize_uint8(x, cfg.image_size) for x in images]
    return PreparedData(
        train_images=images[0],
        train_labels=torch.tensor(train.targets, dtype=torch.int64),
        test_images=images[1],
        test_labels=torch.tensor(test.targets, dtype=torch.int64),
        classes=tuple(train.classes),
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
    )


def _resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    resized = F.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False)
    return resized.round().clamp(0, 255).to(torch.uint8)


def _unverified_cifar10() -> type[CIFAR10]:
    """torchvision's loader with its MD5s blanked (check_integrity(path, None) only checks the file exists)."""

    class UnverifiedCIFAR10(CIFAR10):
        train_list = [[name, None] for name, _ in CIFAR10.train_list]
        test_list = [[name, None] for name, _ in CIFAR10.test_list]
        meta = {**CIFAR10.meta, "md5": None}

    return UnverifiedCIFAR10


@contextmanager
def _cifar10_root(path: Path, verify: bool) -> Iterator[Path]:
    """A directory holding ``cifar-10-batches-py/``: the user's own, or a temporary extraction of the archive."""
    folder = CIFAR10.base_folder
    if path.is_dir() and (path / folder).is_dir():
        path = path / folder
    elif path.is_dir() and (path / CIFAR10.filename).is_file():
        path = path / CIFAR10.filename
    if path.is_dir():
        _require_batches(path, verify)
        if path.name == folder:
            yield path.parent
            return
        with tempfile.TemporaryDirectory(prefix="cifar10-") as tmp:  # the loader wants the folder's exact name
            (Path(tmp) / folder).symlink_to(path.resolve(), target_is_directory=True)
            yield Path(tmp)
        return
    if not path.is_file():
        raise FileNotFoundError(
            f"data.cifar10_path: {path} does not exist; expected {CIFAR10.filename} or its extracted "
            f"{folder}/ folder there. {_how_to_get()}"
        )
    if verify and not check_integrity(str(path), CIFAR10.tgz_md5):
        raise ValueError(
            f"{path}: MD5 does not match torchvision's published {CIFAR10.tgz_md5} for {CIFAR10.filename} "
            f"(truncated or corrupted download?). {_how_to_get()}"
        )
    with tempfile.TemporaryDirectory(prefix="cifar10-") as tmp:
        try:
            extract_archive(str(path), tmp)
        except Exception as err:  # tarfile/gzip raise a zoo of types for a broken archive
            raise ValueError(f"{path}: not a readable CIFAR-10 archive ({err}). {_how_to_get()}") from None
        if not (Path(tmp) / folder).is_dir():
            raise ValueError(f"{path}: the archive has no top-level {folder}/ folder. {_how_to_get()}")
        log.info("extracted %s into a temporary directory", path.name)
        yield Path(tmp)


def _require_batches(folder: Path, verify: bool) -> None:
    """Name the missing or corrupted file instead of torchvision's generic 'not found or corrupted'."""
    for name, md5 in [*CIFAR10.train_list, *CIFAR10.test_list, [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]:
        file = folder / name
        if not file.is_file():
            raise FileNotFoundError(
                f"{folder}: missing {name}; expected the extracted {CIFAR10.base_folder}/. {_how_to_get()}"
            )
        if verify and not check_integrity(str(file), md5):
            raise ValueError(f"{file}: MD5 does not match torchvision's published {md5}. {_how_to_get()}")


def _how_to_get() -> str:
    return (
        f"Download the 'CIFAR-10 python version' ({CIFAR10.filename}) from {CIFAR10_URL} and point "
        "data.cifar10_path at it (this pipeline never downloads)."
    )


def provenance(cfg: DataConfig) -> dict:
    """How the split was made, for the manifest: the dataset, its split seed, and whether MD5s were checked."""
    if cfg.dataset == "digits":
        return {
            "dataset": "digits",
            "source": "sklearn.datasets.load_digits",
            "split_seed": DIGITS_SPLIT_SEED,
            "test_fraction": cfg.test_fraction,
        }
    return {
        "dataset": "cifar10",
        "source": "torchvision.datasets.CIFAR10 (official split)",
        "split_seed": None,
        "checksum_verified": cfg.verify_checksum,
    }
