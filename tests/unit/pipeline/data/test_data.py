"""pipeline.data and stages.prepare: the real CIFAR-10 loader on a tiny archive, digits, the on-disk format."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.config import DataConfig
from pipeline.data.cifar10 import CIFAR10_MEAN, CIFAR10_STD
from pipeline.data.prepared import PreparedData, load_prepared, save_prepared
from pipeline.data.sources import channel_stats, prepare_dataset, provenance
from stages import prepare as prepare_stage

PROJECT_ROOT = Path(__file__).resolve().parents[4]


def _cifar_cfg(path: Path | str, verify: bool = False, **kw) -> DataConfig:
    return DataConfig(dataset="cifar10", cifar10_path=str(path), verify_checksum=verify, **kw)


def _expected_images(rows) -> torch.Tensor:
    """CIFAR rows are 1024 R, then 1024 G, then 1024 B values, each plane 32x32 row-major -> (N, 3, 32, 32)."""
    return torch.from_numpy(rows.copy()).reshape(-1, 3, 32, 32)


@pytest.fixture(scope="module")
def digits() -> PreparedData:
    return prepare_dataset(DataConfig(dataset="digits", image_size=16, test_fraction=0.2), Path("."))


# --- cifar10 through torchvision's loader ---------------------------------------------------------------------


@pytest.mark.parametrize("source", ["archive", "folder", "parent_of_folder", "dir_of_archive", "renamed_folder"])
def test_cifar10_round_trips_pixels_and_labels(tiny_cifar10, source):
    if source == "renamed_folder":
        tiny_cifar10.folder.rename(tiny_cifar10.folder.parent / "my-cifar")
    path = {
        "archive": tiny_cifar10.archive,
        "folder": tiny_cifar10.folder,
        "parent_of_folder": tiny_cifar10.folder.parent,
        "dir_of_archive": tiny_cifar10.archive.parent,
        "renamed_folder": tiny_cifar10.folder.parent / "my-cifar",
    }[source]
    data = prepare_dataset(_cifar_cfg(path), Path("/unused"))
    assert data.train_images.dtype == torch.uint8 and data.train_labels.dtype == torch.int64
    assert data.image_shape == (3, 32, 32) and data.num_classes == 10
    torch.testing.assert_close(data.train_images, _expected_images(tiny_cifar10.train_rows), rtol=0, atol=0)
    torch.testing.assert_close(data.test_images, _expected_images(tiny_cifar10.test_rows), rtol=0, atol=0)
    assert data.train_labels.tolist() == tiny_cifar10.train_labels
    assert data.test_labels.tolist() == tiny_cifar10.test_labels
    assert list(data.classes) == tiny_cifar10.classes
    assert (data.mean, data.std) == (CIFAR10_MEAN, CIFAR10_STD)


def test_cifar10_channel_layout_is_rgb_planes(tiny_cifar10):
    """Pixel (row 1, col 2) of image 0 is bytes 34, 1024+34, 2048+34 of its row: a transposed layout fails here."""
    data = prepare_dataset(_cifar_cfg(tiny_cifar10.archive), Path("."))
    row = tiny_cifar10.train_rows[0]
    assert data.train_images[0, :, 1, 2].tolist() == [row[34], row[1024 + 34], row[2048 + 34]]


def test_archive_is_extracted_elsewhere_and_relative_path_uses_root(tiny_cifar10):
    archive_dir = tiny_cifar10.archive.parent
    data = prepare_dataset(_cifar_cfg(tiny_cifar10.archive.name), archive_dir)
    assert len(data.train_labels) == 20
    assert [p.name for p in archive_dir.iterdir()] == ["cifar-10-python.tar.gz"]


def test_cifar10_resizes_when_asked(tiny_cifar10):
    data = prepare_dataset(_cifar_cfg(tiny_cifar10.folder, image_size=16), Path("."))
    assert data.image_shape == (3, 16, 16) and data.train_images.dtype == torch.uint8


def test_corrupted_archive_is_rejected_by_checksum(tmp_path):
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"\x1f\x8b" + b"garbage" * 100)
    with pytest.raises(ValueError, match=r"MD5 does not match.*cifar\.html"):
        prepare_dataset(_cifar_cfg(archive, verify=True), tmp_path)


def test_tiny_archive_fails_verification(tiny_cifar10):
    """Verification is on by default and the tiny archive is not the published one."""
    with pytest.raises(ValueError, match="MD5 does not match"):
        prepare_dataset(DataConfig(dataset="cifar10", cifar10_path=str(tiny_cifar10.archive)), Path("."))
    with pytest.raises(ValueError, match="data_batch_1: MD5 does not match"):
        prepare_dataset(_cifar_cfg(tiny_cifar10.folder, verify=True), Path("."))


def test_truncated_archive_without_verification_is_a_clear_error(tiny_cifar10, tmp_path):
    truncated = tmp_path / "cifar-10-python.tar.gz"
    truncated.write_bytes(tiny_cifar10.archive.read_bytes()[:500])
    with pytest.raises(ValueError, match="not a readable CIFAR-10 archive"):
        prepare_dataset(_cifar_cfg(truncated), tmp_path)


def test_missing_path_and_missing_batch_are_clear(tiny_cifar10, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist; expected cifar-10-python\.tar\.gz.*cifar\.html"):
        prepare_dataset(_cifar_cfg("nowhere/cifar-10-python.tar.gz"), tmp_path)
    (tiny_cifar10.folder / "test_batch").unlink()
    with pytest.raises(FileNotFoundError, match="missing test_batch"):
        prepare_dataset(_cifar_cfg(tiny_cifar10.folder), tmp_path)


# --- digits ---------------------------------------------------------------------------------------------------


def test_digits_shapes_dtypes_counts(digits):
    assert digits.train_images.shape == (1437, 3, 16, 16) and digits.test_images.shape == (360, 3, 16, 16)
    assert digits.train_images.dtype == torch.uint8 and digits.test_labels.dtype == torch.int64
    assert digits.classes == tuple(str(i) for i in range(10)) and digits.num_classes == 10
    assert torch.equal(digits.train_images[:, 0], digits.train_images[:, 2])  # grey replicated to RGB
    assert int(digits.train_images.max()) > 200 and int(digits.train_images.min()) == 0
    assert torch.bincount(digits.test_labels, minlength=10).min() >= 30  # stratified: every class ~36
    assert (digits.mean, digits.std) == channel_stats(digits.train_images)


def test_digits_is_deterministic(digits):
    again = prepare_dataset(DataConfig(dataset="digits", image_size=16, test_fraction=0.2), Path("."))
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        assert torch.equal(getattr(digits, name), getattr(again, name))


# --- on disk --------------------------------------------------------------------------------------------------


def test_save_load_round_trip_and_manifest(digits, tmp_path):
    cfg = DataConfig(dataset="digits", image_size=16)
    manifest = save_prepared(digits, tmp_path / "prepared", provenance(cfg))
    assert json.loads((tmp_path / "prepared" / "manifest.json").read_text()) == manifest
    assert manifest["dataset"] == "digits" and manifest["split_seed"] == 0
    assert (manifest["num_train"], manifest["num_test"], manifest["image_shape"]) == (1437, 360, [3, 16, 16])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prepared"]  # no temp dirs left
    loaded = load_prepared(tmp_path / "prepared")
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        assert torch.equal(getattr(loaded, name), getattr(digits, name))
    assert (loaded.classes, loaded.mean, loaded.std) == (digits.classes, digits.mean, digits.std)
    tensors = torch.load(tmp_path / "prepared" / "train.pt", weights_only=True)
    assert set(tensors) == {"images", "labels"}


def test_save_replaces_previous_output_and_is_idempotent(digits, tiny_cifar10, tmp_path):
    out = tmp_path / "prepared"
    save_prepared(prepare_dataset(_cifar_cfg(tiny_cifar10.folder), tmp_path), out)
    save_prepared(digits, out)
    assert load_prepared(out).image_shape == (3, 16, 16)
    mtime = (out / "train.pt").stat().st_mtime_ns
    save_prepared(digits, out)
    assert (out / "train.pt").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar", "prepared"]


def test_failed_save_keeps_previous_output(digits, tmp_path, monkeypatch):
    out = tmp_path / "prepared"
    save_prepared(digits, out)
    before = (out / "train.pt").read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    smaller = PreparedData(
        digits.train_images[:10],
        digits.train_labels[:10],
        digits.test_images,
        digits.test_labels,
        digits.classes,
        digits.mean,
        digits.std,
    )
    with pytest.raises(OSError, match="disk full"):
        save_prepared(smaller, out)
    assert (out / "train.pt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prepared"]


def test_tampered_or_missing_files_are_detected(digits, tmp_path):
    out = tmp_path / "prepared"
    save_prepared(digits, out)
    tensors = torch.load(out / "test.pt", weights_only=True)
    tensors["images"][0, 0, 0, 0] ^= 1
    torch.save(tensors, out / "test.pt")
    with pytest.raises(ValueError, match="content_sha256"):
        load_prepared(out)
    (out / "test.pt").write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="unreadable tensor file"):
        load_prepared(out)
    (out / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match="corrupt prepared dataset"):
        load_prepared(out)
    with pytest.raises(FileNotFoundError, match="dvc repro prepare"):
        load_prepared(tmp_path / "absent")


# --- the stage ------------------------------------------------------------------------------------------------


def _write_params(path: Path, **data) -> Path:
    raw = yaml.safe_load((PROJECT_ROOT / "params.yaml").read_text())
    raw["data"].update(data)
    path.write_text(yaml.safe_dump(raw))
    return path


def test_stage_help_shows_docstring():
    result = subprocess.run(
        [sys.executable, "-m", "stages.prepare", "--help"], capture_output=True, text=True, cwd=PROJECT_ROOT, check=True
    )
    assert "Writes: data.prepared_dir" in result.stdout and "--params" in result.stdout


def test_stage_writes_outputs_in_cwd(tmp_path, monkeypatch):
    params = _write_params(tmp_path / "p.yaml", prepared_dir="out/prepared", image_size=16)  # resized from 8x8
    monkeypatch.chdir(tmp_path)
    assert prepare_stage.main(["--params", str(params)]) == 0
    manifest = json.loads((tmp_path / "out/prepared/manifest.json").read_text())
    assert manifest["dataset"] == "digits" and manifest["image_shape"] == [3, 16, 16]
    assert {p.name for p in (tmp_path / "out/prepared").iterdir()} == {"manifest.json", "train.pt", "test.pt"}


def test_stage_cifar10_from_tiny_archive(tiny_cifar10, tmp_path, monkeypatch):
    params = _write_params(
        tmp_path / "p.yaml",
        dataset="cifar10",
        cifar10_path=str(tiny_cifar10.archive),
        verify_checksum=False,
        image_size=32,
    )
    monkeypatch.chdir(tmp_path)
    assert prepare_stage.main(["--params", str(params)]) == 0
    assert load_prepared(tmp_path / "data/prepared").test_labels.tolist() == tiny_cifar10.test_labels


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"image_size": -1}, "data.image_size"),
        ({"dataset": "mnist"}, "data.dataset"),
        ({"dataset": "cifar10", "cifar10_path": "missing.tar.gz"}, "data.cifar10_path"),
        ({"test_fraction": 0.001}, "data.test_fraction"),  # 2 test digits cannot hold 10 classes
    ],
)
def test_stage_bad_params_exit_2_naming_the_key(tmp_path, monkeypatch, caplog, data, key):
    params = _write_params(tmp_path / "p.yaml", **data)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.ERROR):
        assert prepare_stage.main(["--params", str(params)]) == 2
    assert key in caplog.text
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("prepared_dir", "message"),
    [
        (".", "not a prepared dataset"),  # the project itself
        ("", "not a prepared dataset"),
        ("src", "not a prepared dataset"),  # a folder with someone's files
        ("notes.txt", "not a directory"),
        ("notes.txt/prepared", "notes.txt exists and is not a directory"),
        ("missing/../src", "not a prepared dataset"),  # checked as the folder it names, not as written
        ("/proc/prepared", "cannot write in /proc"),  # permission bits say yes to root; writing says no
    ],
)
def test_stage_never_replaces_what_is_not_a_prepared_dataset(tmp_path, monkeypatch, caplog, prepared_dir, message):
    """Replacing swaps the whole directory: a wrong data.prepared_dir must be refused before the data is built,
    and every file already there must survive."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("keep me\n")
    (tmp_path / "notes.txt").write_text("keep me too\n")
    params = _write_params(tmp_path / "p.yaml", prepared_dir=prepared_dir)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO):
        assert prepare_stage.main(["--params", str(params)]) == 2
    assert "data.prepared_dir" in caplog.text and message in caplog.text
    assert "preparing digits" not in caplog.text  # refused before any work
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing created either
    assert (tmp_path / "src" / "code.py").read_text() == "keep me\n"


def test_save_replaces_an_empty_or_damaged_prepared_dataset(digits, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    save_prepared(digits, empty)
    (empty / "train.pt").unlink()  # damaged, but its manifest says it is ours
    save_prepared(digits, empty)
    assert load_prepared(empty).train_labels.tolist() == digits.train_labels.tolist()
    with pytest.raises(ValueError, match="not a prepared dataset"):
        save_prepared(digits, tmp_path)  # holds other files
