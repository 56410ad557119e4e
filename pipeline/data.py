"""Datasets as uint8 tensors on disk: the paper's CIFAR-10 and an embedded offline stand-in.

``prepare_dataset`` turns a ``DataConfig`` into a ``PreparedData`` (uint8 images (N, C, H, W), int64 labels, class
names and the per-channel normalisation of ``images / 255``). ``save_prepared`` writes it as ``train.pt``,
``test.pt`` and ``manifest.json`` atomically; ``load_prepared`` reads it back and checks the manifest's content hash.

- ``cifar10`` (the paper, Section 4): read by torchvision's own ``CIFAR10`` loader (never downloading) from an
  existing ``cifar-10-python.tar.gz`` or its extracted ``cifar-10-batches-py/`` folder, checked against torchvision's
  published MD5s unless ``verify_checksum`` is explicitly off (tests write a tiny archive in the real format).
- ``digits``: scikit-learn's bundled handwritten digits (1797 8x8 grey images), resized and made RGB, so the whole
  pipeline runs offline on a laptop CPU. The split is stratified with a fixed seed recorded in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import check_integrity, extract_archive

from pipeline.config import DataConfig

log = logging.getLogger(__name__)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
# The paper's normalisation (authors' code, from the usual CIFAR-10 recipe).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR10_SIZE = 32
DIGITS_SPLIT_SEED = 0
MANIFEST_VERSION = 1
_TENSOR_FIELDS = ("train_images", "train_labels", "test_images", "test_labels")


@dataclass(frozen=True)
class PreparedData:
    """A train/test split ready for training: uint8 images (N, C, H, W), int64 labels, normalisation of images/255."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train_images.shape[1:]
        return (int(c), int(h), int(w))

    @property
    def num_classes(self) -> int:
        return len(self.classes)


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
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)),
        test_size=cfg.test_fraction,
        stratify=digits.target,
        random_state=DIGITS_SPLIT_SEED,
    )
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


# --- on disk --------------------------------------------------------------------------------------------------


def content_hash(data: PreparedData) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes: what load_prepared checks against the manifest."""
    digest = hashlib.sha256()
    for name in _TENSOR_FIELDS:
        tensor = getattr(data, name).contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


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


def build_manifest(data: PreparedData, cfg: DataConfig | None = None) -> dict:
    """What a reader needs without loading tensors, plus the hash that ties the manifest to them."""
    return {
        "version": MANIFEST_VERSION,
        **(provenance(cfg) if cfg is not None else {"dataset": None}),
        "num_train": int(data.train_labels.numel()),
        "num_test": int(data.test_labels.numel()),
        "image_shape": list(data.image_shape),
        "num_classes": data.num_classes,
        "classes": list(data.classes),
        "mean": list(data.mean),
        "std": list(data.std),
        "files": {"train": "train.pt", "test": "test.pt"},
        "content_sha256": content_hash(data),
    }


def save_prepared(data: PreparedData, out_dir: Path, cfg: DataConfig | None = None) -> dict:
    """Write train.pt, test.pt and manifest.json into a sibling temp dir, then swap it into place.

    A killed run leaves at most a ``.<name>.tmp-*`` directory; the previous output is only removed once the new one
    is complete. Writing the same data again changes nothing on disk. ``cfg`` adds the dataset name and split seed to
    the manifest. Returns the manifest.
    """
    out_dir = Path(out_dir)
    manifest = build_manifest(data, cfg)
    if _same_output(out_dir, manifest):
        log.info("%s is already up to date (content %s)", out_dir, manifest["content_sha256"][:12])
        return manifest
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        for split in ("train", "test"):
            tensors = {"images": getattr(data, f"{split}_images"), "labels": getattr(data, f"{split}_labels")}
            torch.save(tensors, tmp / f"{split}.pt")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        _fsync_dir(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        _swap_into_place(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("wrote %d train + %d test examples to %s", manifest["num_train"], manifest["num_test"], out_dir)
    return manifest


def _same_output(out_dir: Path, manifest: dict) -> bool:
    try:
        if json.loads((out_dir / "manifest.json").read_text()) != manifest:
            return False
        load_prepared(out_dir)
    except (OSError, ValueError):
        return False
    return True


def _fsync_dir(folder: Path) -> None:
    """Flush the files before the rename makes them visible, so a crash cannot expose empty files."""
    for file in folder.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def _swap_into_place(new: Path, out_dir: Path) -> None:
    """rename() cannot replace a non-empty directory: move the old one aside, move the new one in, drop the old."""
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, old / out_dir.name)
    os.rename(new, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def load_prepared(out_dir: Path) -> PreparedData:
    """Read what save_prepared wrote; missing files, unreadable tensors or a hash mismatch raise clearly."""
    out_dir = Path(out_dir)
    hint = "re-create it with `dvc repro prepare` (or `python -m stages.prepare`)"
    manifest_path = out_dir / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path}: no prepared dataset here; {hint}")
    try:
        manifest = json.loads(manifest_path.read_text())
        splits = {split: _load_split(out_dir / manifest["files"][split]) for split in ("train", "test")}
        data = PreparedData(
            train_images=splits["train"]["images"],
            train_labels=splits["train"]["labels"],
            test_images=splits["test"]["images"],
            test_labels=splits["test"]["labels"],
            classes=tuple(manifest["classes"]),
            mean=tuple(float(v) for v in manifest["mean"]),
            std=tuple(float(v) for v in manifest["std"]),
        )
        expected = manifest["content_sha256"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{out_dir}: corrupt prepared dataset ({type(err).__name__}: {err}); {hint}") from None
    if content_hash(data) != expected:
        raise ValueError(f"{out_dir}: tensors do not match the manifest's content_sha256 (modified?); {hint}")
    log.info(
        "loaded %s: %d train, %d test, images %s",
        out_dir,
        len(data.train_labels),
        len(data.test_labels),
        data.image_shape,
    )
    return data


def _load_split(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; re-create it with `dvc repro prepare`")
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError... for a damaged file
        raise ValueError(f"{path}: unreadable tensor file ({type(err).__name__}: {err})") from None
    if not isinstance(tensors, dict) or not all(isinstance(tensors.get(k), torch.Tensor) for k in ("images", "labels")):
        raise ValueError(f"{path}: expected a dict with 'images' and 'labels' tensors")
    if tensors["images"].dtype != torch.uint8 or tensors["labels"].dtype != torch.int64:
        raise ValueError(f"{path}: expected uint8 images and int64 labels")
    return tensors
