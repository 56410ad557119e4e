"""The prepared dataset: uint8 tensors in memory (``PreparedData``) and on disk (``data/prepared``).

A ``PreparedData`` holds uint8 images (N, C, H, W), int64 labels, class names and the per-channel normalisation of
``images / 255``, and a validation set when ``data.validation_fraction`` carved one (``pipeline.data.validation``).
``save_prepared`` writes it as ``train.pt``, ``test.pt`` (``val.pt`` with a validation set) and ``manifest.json``
atomically;
``load_prepared`` reads it back and checks the manifest's content hash. Where the images come from (CIFAR-10,
digits) is ``pipeline.data.sources``: this module stays light (torch only) because every Ray trial unpickles it,
and it is in every trial's code identity (``pipeline.trial.code_version``): an edit here retrains every trial.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
REBUILD_HINT = "re-create it with `dvc repro prepare` (or `python -m stages.prepare`)"
_TENSOR_FIELDS = ("train_images", "train_labels", "test_images", "test_labels")
_VALIDATION_FIELDS = ("val_images", "val_labels")  # hashed after the others, only when there is a validation set


@dataclass(frozen=True)
class PreparedData:
    """A train/test split ready for training: uint8 images (N, C, H, W), int64 labels, normalisation of images/255;
    a validation set carved from the training images when ``val_images`` is not None."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    val_images: torch.Tensor | None = None
    val_labels: torch.Tensor | None = None

    @property
    def has_validation(self) -> bool:
        return self.val_labels is not None

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits held, as named on disk: train, test, and val when there is a validation set."""
        return ("train", "test", "val") if self.has_validation else ("train", "test")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train_images.shape[1:]
        return (int(c), int(h), int(w))

    @property
    def num_classes(self) -> int:
        return len(self.classes)


# --- on disk --------------------------------------------------------------------------------------------------


def content_hash(data: PreparedData) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes: what load_prepared checks against the manifest.

    Without a validation set the hash is what it was before validation sets existed, so the paper's protocol keeps
    its prepared data's identity (and every trial identity built on it)."""
    digest = hashlib.sha256()
    for name in _TENSOR_FIELDS + (_VALIDATION_FIELDS if data.has_validation else ()):
        tensor = getattr(data, name).contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def build_manifest(data: PreparedData, provenance: dict | None = None) -> dict:
    """What a reader needs without loading tensors, plus the hash that ties the manifest to them."""
    counts = {"num_train": int(data.train_labels.numel()), "num_test": int(data.test_labels.numel())}
    if data.val_labels is not None:
        counts["num_val"] = int(data.val_labels.numel())
    return {
        "version": MANIFEST_VERSION,
        **(provenance or {"dataset": None}),
        **counts,
        "image_shape": list(data.image_shape),
        "num_classes": data.num_classes,
        "classes": list(data.classes),
        "mean": list(data.mean),
        "std": list(data.std),
        "files": {split: f"{split}.pt" for split in data.splits},
        "content_sha256": content_hash(data),
    }


def check_output_dir(out_dir: Path) -> None:
    """Raise ``ValueError`` unless ``save_prepared`` may replace ``out_dir``: it is absent, an empty directory, or a
    directory holding a manifest written here (a prepared dataset, possibly damaged); and it can be created.

    Replacing swaps the whole directory, so anything else there (the project itself for ``.``, a source folder,
    the CIFAR-10 archive) would be deleted: call this before any expensive work.
    """
    out_dir = Path(os.path.abspath(out_dir))  # lexically: "missing/../pipeline" is pipeline, checked as such
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir() or out_dir.is_symlink():
            raise ValueError(f"{out_dir} exists and is not a directory; refusing to replace it")
        if any(out_dir.iterdir()) and not _is_manifest(out_dir / "manifest.json"):
            raise ValueError(
                f"{out_dir} is not a prepared dataset (no manifest.json written by the prepare stage); refusing to "
                "replace it and delete its contents: choose another directory"
            )
        if Path.cwd().absolute().is_relative_to(out_dir):
            raise ValueError(f"{out_dir} contains the working directory; refusing to replace it")
    # Imported here: trials load this module but never write a dataset, and the stages' file helpers must not be
    # part of the trial code whose edits retrain a sweep.
    from pipeline.io import check_creatable_dir

    check_creatable_dir(out_dir.parent)  # the new directory is written next to it, then swapped in


def _is_manifest(path: Path) -> bool:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and {"version", "content_sha256", "files"} <= manifest.keys()


def save_prepared(data: PreparedData, out_dir: Path, provenance: dict | None = None) -> dict:
    """Write train.pt, test.pt (val.pt) and manifest.json into a sibling temp dir, then swap it into place.

    A killed run leaves at most a ``.<name>.tmp-*`` directory; the previous output is only removed once the new one
    is complete. Writing the same data again changes nothing on disk. ``provenance`` (``sources.provenance``) adds
    the dataset and split seed to the manifest. Returns the manifest. Refuses (``check_output_dir``) to replace
    anything that is not a prepared dataset.
    """
    out_dir = Path(os.path.abspath(out_dir))  # the directory that was checked is the one that is replaced
    check_output_dir(out_dir)
    manifest = build_manifest(data, provenance)
    if _same_output(out_dir, manifest):
        log.info("%s is already up to date (content %s)", out_dir, manifest["content_sha256"][:12])
        return manifest
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        for split in data.splits:
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
    hint = REBUILD_HINT
    manifest_path = out_dir / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path}: no prepared dataset here; {hint}")
    try:
        manifest = json.loads(manifest_path.read_text())
        splits = {split: _load_split(out_dir / file) for split, file in manifest["files"].items()}
        validation = splits.get("val", {})
        data = PreparedData(
            train_images=splits["train"]["images"],
            train_labels=splits["train"]["labels"],
            test_images=splits["test"]["images"],
            test_labels=splits["test"]["labels"],
            classes=tuple(manifest["classes"]),
            mean=tuple(float(v) for v in manifest["mean"]),
            std=tuple(float(v) for v in manifest["std"]),
            val_images=validation.get("images"),
            val_labels=validation.get("labels"),
        )
        expected = manifest["content_sha256"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{out_dir}: corrupt prepared dataset ({type(err).__name__}: {err}); {hint}") from None
    if content_hash(data) != expected:
        raise ValueError(f"{out_dir}: tensors do not match the manifest's content_sha256 (modified?); {hint}")
    log.info(
        "loaded %s: %d train, %d validation, %d test, images %s",
        out_dir,
        len(data.train_labels),
        0 if data.val_labels is None else len(data.val_labels),
        len(data.test_labels),
        data.image_shape,
    )
    return data


def _load_split(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; {REBUILD_HINT}")
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError... for a damaged file
        raise ValueError(f"{path}: unreadable tensor file ({type(err).__name__}: {err})") from None
    if not isinstance(tensors, dict) or not all(isinstance(tensors.get(k), torch.Tensor) for k in ("images", "labels")):
        raise ValueError(f"{path}: expected a dict with 'images' and 'labels' tensors")
    if tensors["images"].dtype != torch.uint8 or tensors["labels"].dtype != torch.int64:
        raise ValueError(f"{path}: expected uint8 images and int64 labels")
    return tensors
