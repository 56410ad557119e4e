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

from benchmarks.cifar_archive import write_cifar10
from pipeline.config import DataConfig
from pipeline.data.cifar10 import CIFAR10_MEAN, CIFAR10_STD
from pipeline.data.prepared import PreparedData, load_prepared, save_prepared
from pipeline.data.sources import channel_stats, prepare_dataset, provenance
from pipeline.data.validation import carve_validation
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
        ({"validation_fraction": 0.001}, "data.validation_fraction"),  # no class keeps a validation image
        ({"validation_fraction": 1.0}, "data.validation_fraction"),
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


# --- the validation split (data.validation_fraction) ------------------------------------------------------------

# content_sha256 of the default params.yaml's digits, computed with the code before validation sets existed: a
# fraction of 0 must leave the prepared data, and so every trial identity built on it, exactly as it was.
DEFAULT_DIGITS_SHA256 = "c56269b8dfc597ffdd6659598c3e20dfdb72291604866f9f9fdecc0872c0c465"


def _default_data(**overrides) -> DataConfig:
    raw = yaml.safe_load((PROJECT_ROOT / "params.yaml").read_text())["data"]
    return DataConfig(**(raw | overrides))


def test_no_validation_keeps_the_default_hash_files_and_manifest(tmp_path):
    data = prepare_dataset(_default_data(), Path("."))
    assert _default_data().validation_fraction == 0 and not data.has_validation
    manifest = save_prepared(data, tmp_path / "prepared", provenance(_default_data()))
    assert manifest["content_sha256"] == DEFAULT_DIGITS_SHA256
    assert "num_val" not in manifest and "validation_fraction" not in manifest
    assert {p.name for p in (tmp_path / "prepared").iterdir()} == {"manifest.json", "train.pt", "test.pt"}


def test_validation_is_carved_per_class_from_train_only(digits):
    carved = prepare_dataset(
        DataConfig(dataset="digits", image_size=16, test_fraction=0.2, validation_fraction=0.1), Path(".")
    )
    assert torch.equal(carved.test_images, digits.test_images)  # the test set is untouched
    before = torch.bincount(digits.train_labels, minlength=10)
    train, val = (torch.bincount(t, minlength=10) for t in (carved.train_labels, carved.val_labels))
    assert torch.equal(train + val, before)
    assert torch.equal(val, (before * 0.1 + 0.5).floor().long())  # round(10 %) of every class, halves up
    assert (carved.mean, carved.std) == channel_stats(carved.train_images)  # normalised on training images only


def test_carving_moves_each_image_to_exactly_one_side_in_order():
    """Images whose pixels are their index: the two sides partition the training set, each in its original order."""
    labels = torch.arange(60) % 3
    data = PreparedData(
        torch.arange(60, dtype=torch.uint8).view(60, 1, 1, 1),
        labels,
        labels[:3].view(3, 1, 1, 1).byte(),
        labels[:3],
        ("a", "b", "c"),
        (0.0,),
        (1.0,),
    )
    carved = carve_validation(data, 0.25)
    train, val = carved.train_images.flatten().tolist(), carved.val_images.flatten().tolist()
    assert sorted(train + val) == list(range(60)) and train == sorted(train) and val == sorted(val)
    assert torch.equal(carved.val_labels, labels[val]) and torch.equal(carved.train_labels, labels[train])
    assert torch.bincount(carved.val_labels).tolist() == [5, 5, 5]
    assert carve_validation(data, 0) is data


def test_validation_split_is_deterministic_and_saved_with_its_hash(tmp_path):
    cfg = DataConfig(dataset="digits", image_size=8, validation_fraction=0.25)
    first, again = prepare_dataset(cfg, Path(".")), prepare_dataset(cfg, Path("."))
    assert torch.equal(first.val_labels, again.val_labels) and torch.equal(first.val_images, again.val_images)
    manifest = save_prepared(first, tmp_path / "prepared", provenance(cfg))
    assert {p.name for p in (tmp_path / "prepared").iterdir()} == {"manifest.json", "train.pt", "test.pt", "val.pt"}
    assert (manifest["validation_fraction"], manifest["validation_seed"]) == (0.25, 0)
    assert manifest["num_val"] == len(first.val_labels) and manifest["files"]["val"] == "val.pt"
    assert manifest["content_sha256"] != DEFAULT_DIGITS_SHA256
    loaded = load_prepared(tmp_path / "prepared")
    assert torch.equal(loaded.val_images, first.val_images) and torch.equal(loaded.val_labels, first.val_labels)
    tensors = torch.load(tmp_path / "prepared" / "val.pt", weights_only=True)
    tensors["images"][0, 0, 0, 0] ^= 1  # the validation tensors are part of the content hash
    torch.save(tensors, tmp_path / "prepared" / "val.pt")
    with pytest.raises(ValueError, match="content_sha256"):
        load_prepared(tmp_path / "prepared")


def test_cifar10_validation_split(tmp_path):
    """The real loader on a small real-format archive with every class present at least twice."""
    archive = write_cifar10(tmp_path / "cifar", per_batch=40)
    data = prepare_dataset(_cifar_cfg(archive.archive, validation_fraction=0.2), tmp_path)
    counts = torch.bincount(torch.tensor(archive.train_labels), minlength=10)
    assert torch.equal(torch.bincount(data.val_labels, minlength=10), (counts * 0.2 + 0.5).floor().long())
    assert len(data.train_labels) + len(data.val_labels) == 200
    assert data.test_labels.tolist() == archive.test_labels and (data.mean, data.std) == (CIFAR10_MEAN, CIFAR10_STD)


def test_a_fraction_leaving_a_class_empty_is_refused_naming_the_key(tiny_cifar10, tmp_path):
    # The tiny archive has 20 random labels: some class has a single training image, which cannot go both ways.
    assert torch.bincount(torch.tensor(tiny_cifar10.train_labels)).tolist().count(1) > 0
    with pytest.raises(ValueError, match=r"data\.validation_fraction: 0\.5 leaves a class with no training"):
        prepare_dataset(_cifar_cfg(tiny_cifar10.archive, validation_fraction=0.5), tmp_path)
    with pytest.raises(ValueError, match=r"data\.validation_fraction: 0\.001 .*-> 0 validation"):
        prepare_dataset(DataConfig(dataset="digits", validation_fraction=0.001), tmp_path)


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_a_fraction_outside_0_1_is_refused_naming_the_key(fraction):
    with pytest.raises(ValueError, match="validation_fraction"):
        DataConfig(dataset="digits", validation_fraction=fraction)


def test_stage_writes_the_validation_set_the_analysis_reads_back(tmp_path, monkeypatch):
    from stages.analyze import validation_set_size

    monkeypatch.chdir(tmp_path)
    assert prepare_stage.main(["--params", str(_write_params(tmp_path / "p.yaml", validation_fraction=0.1))]) == 0
    manifest = json.loads((tmp_path / "data/prepared/manifest.json").read_text())
    held_out = len(load_prepared(tmp_path / "data/prepared").val_labels)
    assert manifest["num_val"] == held_out == validation_set_size(tmp_path / "data/prepared")
    assert manifest["num_val"] + manifest["num_train"] == 1437 and 140 <= held_out <= 150  # 10 % per class, rounded
    assert prepare_stage.main(["--params", str(_write_params(tmp_path / "p.yaml", validation_fraction=0))]) == 0
    assert not (tmp_path / "data/prepared/val.pt").exists() and validation_set_size(tmp_path / "data/prepared") is None
