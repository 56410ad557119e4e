"""The paper's dataset (Section 4), read by torchvision's own ``CIFAR10`` loader, never downloading.

From an existing ``cifar-10-python.tar.gz`` or its extracted ``cifar-10-batches-py/`` folder, checked against
torchvision's published MD5s unless ``data.verify_checksum`` is explicitly off (tests write a tiny archive in the real
format). Its own module because importing torchvision costs about 1.4 CPU-s (it imports TorchDynamo): the embedded
default's prepare stage never pays it.
"""

from __future__ import annotations

import logging
import pickle
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


def prepare_cifar10(path: Path, cfg: DataConfig) -> PreparedData:
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
