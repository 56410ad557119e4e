"""CIFAR-10 archives in the real format (``cifar-10-python.tar.gz``), written here: CIFAR-10 cannot be downloaded where
the tests and the GPU machines run, and the loader (``pipeline.data.cifar10``) must still read the real format.

The batches are Python 2 pickles of byte-keyed dicts, as in the published archive: ``data_batch_1`` .. ``_5``,
``test_batch`` and ``batches.meta``, under a top-level ``cifar-10-batches-py/`` folder. The pixels are synthetic, so
torchvision's MD5s do not match: read them with ``data.verify_checksum: false``.

- ``write_cifar10(directory, per_batch)``: uniformly random pixels and labels (the loader's tests).
- ``learnable_images(...)``: pixels that carry their label (a smooth template per class plus noise), so that a short
  training run on a full-size archive shows its loss falling, at the real data's size and shape.
"""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
ROW = 3 * 32 * 32  # one image: R plane, G plane, B plane, each 32x32 row-major


class _Python2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` opcodes, as the real batches (pickled by Python 2) hold them.

    torchvision unpickles with ``encoding="latin1"``, which turns those into ``str`` keys (``entry["data"]``); Python
    3's own pickler would write bytes objects that stay ``b"data"`` and the real loader would not find them.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def _py2_pickle(obj: object) -> bytes:
    buffer = io.BytesIO()
    _Python2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


@dataclass(frozen=True)
class Cifar10Archive:
    archive: Path  # cifar-10-python.tar.gz with top folder cifar-10-batches-py/
    folder: Path  # the same batches, extracted
    train_rows: np.ndarray  # uint8 (N, 3072)
    train_labels: list[int]
    test_rows: np.ndarray
    test_labels: list[int]
    classes: list[str]


def random_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, list[int]]:
    """Uniformly random pixels and labels: ``(n, 3072)`` uint8 rows and ``n`` labels in [0, 10)."""
    return rng.integers(0, 256, size=(n, ROW), dtype=np.uint8), [int(v) for v in rng.integers(0, 10, size=n)]


def learnable_images(rng: np.random.Generator, n: int, templates: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Rows whose pixels carry their label: the class's template (``class_templates``) plus uniform noise, in equal
    parts, so a classifier learns it within an epoch or two but not at once."""
    labels = rng.integers(0, 10, size=n)
    noise = rng.integers(0, 256, size=(n, ROW), dtype=np.uint16)
    rows = (templates[labels].astype(np.uint16) + noise) // 2
    return rows.astype(np.uint8), [int(v) for v in labels]


def class_templates(rng: np.random.Generator) -> np.ndarray:
    """One smooth colour image per class, ``(10, 3072)`` uint8: a random 4x4 colour pattern upsampled to 32x32, so
    that the random crops and flips of training keep it recognisable."""
    coarse = rng.integers(0, 256, size=(10, 3, 4, 4), dtype=np.uint8)
    return coarse.repeat(8, axis=2).repeat(8, axis=3).reshape(10, ROW)


def write_cifar10(directory: Path, per_batch: int = 4, seed: int = 0, learnable: bool = False) -> Cifar10Archive:
    """``data_batch_1..5`` of ``per_batch`` images each, a ``test_batch`` of ``per_batch``, ``batches.meta``, and the
    ``.tar.gz`` of them, under ``directory`` (which must not hold a ``cifar-10-batches-py/`` yet)."""
    rng = np.random.default_rng(seed)
    templates = class_templates(rng) if learnable else None
    folder = directory / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {name: f"training batch {i} of 5" for i, name in enumerate(TRAIN_BATCHES, start=1)}
    batches["test_batch"] = "testing batch 1 of 1"
    rows, labels = {}, {}
    for name, batch_label in batches.items():
        if templates is None:
            rows[name], labels[name] = random_images(rng, per_batch)
        else:
            rows[name], labels[name] = learnable_images(rng, per_batch, templates)
        entry = {
            b"batch_label": batch_label.encode(),
            b"labels": labels[name],
            b"data": rows[name],
            b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)],
        }
        (folder / name).write_bytes(_py2_pickle(entry))
    meta = {b"num_cases_per_batch": per_batch, b"label_names": [c.encode() for c in CIFAR10_CLASSES], b"num_vis": ROW}
    (folder / "batches.meta").write_bytes(_py2_pickle(meta))
    archive = directory / "archive" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:  # level 1: 180 MB at full size, in seconds
        tar.add(folder, arcname="cifar-10-batches-py")
    return Cifar10Archive(
        archive=archive,
        folder=folder,
        train_rows=np.concatenate([rows[n] for n in TRAIN_BATCHES]),
        train_labels=[label for n in TRAIN_BATCHES for label in labels[n]],
        test_rows=rows["test_batch"],
        test_labels=labels["test_batch"],
        classes=CIFAR10_CLASSES,
    )
