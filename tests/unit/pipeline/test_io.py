"""Outputs are never half-written: a write that fails leaves the previous file whole, and no reader sees a part."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import subprocess
from pathlib import Path

import pytest

from pipeline.io import StorageFaultError, lasting_os_error, write_json_atomic, write_stage_metrics
from stages._cli import make_parser, run


def test_a_failed_write_leaves_the_previous_output_whole(tmp_path: Path) -> None:
    manifest = tmp_path / "results/tune/manifest.json"
    write_json_atomic(manifest, {"trials": [1, 2]})
    (manifest.parent / f".{manifest.name}.tmp").mkdir()  # the temporary file cannot be written (as on a full disk)
    with pytest.raises(OSError):
        write_json_atomic(manifest, {"trials": [1, 2, 3]})
    assert json.loads(manifest.read_text()) == {"trials": [1, 2]}


def test_the_output_appears_complete_in_one_rename(tmp_path: Path) -> None:
    manifest = tmp_path / "out/metrics.json"
    write_json_atomic(manifest, {"b": 1, "a": [1.5]})
    assert manifest.read_text() == '{\n  "a": [\n    1.5\n  ],\n  "b": 1\n}\n'
    assert [p.name for p in manifest.parent.iterdir()] == ["metrics.json"]  # no temporary file left behind


def test_a_stage_writes_its_figures_and_one_accuracy_per_variant_for_dvc(tmp_path: Path) -> None:
    summary = {
        "sa_quadratic_9": {"test_acc": 0.95, "test_acc_n": 2, "test_acc_std": 0.01},
        "resnet18": {"test_acc": 0.99, "test_acc_n": 2, "test_acc_std": 0.0},
    }
    write_stage_metrics(tmp_path / "results/tune", summary)
    assert json.loads((tmp_path / "results/tune/metrics.json").read_text()) == summary
    headline = (tmp_path / "results/tune/test_acc.json").read_text()
    assert json.loads(headline) == {"resnet18": 0.99, "sa_quadratic_9": 0.95}  # flat: `dvc exp show` column names
    assert headline.index("resnet18") < headline.index("sa_quadratic_9")  # sorted, as every output


def test_a_lasting_disk_fault_is_found_through_the_wrappers() -> None:
    """Ray wraps a trial's error (``RayTaskError.cause``), Tune and pyarrow chain theirs: a full disk is found in
    any of them, a passing fault (an interrupted call, a reset connection) is not."""

    class Wrapped(RuntimeError):  # as Ray's RayTaskError: the trial's exception in ``cause``
        def __init__(self, cause: BaseException) -> None:
            super().__init__("ray::ImplicitFunc.train()")
            self.cause = cause

    full = OSError(errno.ENOSPC, "Error writing bytes to file")
    try:
        raise RuntimeError("tune") from Wrapped(full)
    except RuntimeError as err:
        assert lasting_os_error(err) is full
    assert lasting_os_error(Wrapped(OSError(errno.EINTR, "interrupted"))) is None
    assert lasting_os_error(ConnectionResetError(errno.ECONNRESET, "reset")) is None
    assert lasting_os_error(None) is None


def test_a_storage_fault_names_the_key_the_path_and_what_to_do() -> None:
    line = str(StorageFaultError("/mnt/ray", OSError(errno.ENOSPC, "x"), what="trial t1 wrote to it"))
    assert line.startswith("cannot write sweep.storage_path /mnt/ray (No space left on device) while trial t1")
    assert "free space there or set sweep.storage_path to another location, then re-run" in line
    read_only = str(StorageFaultError("results/tune/.manifest.json.tmp", OSError(errno.EROFS, "x"), key=None))
    assert read_only.startswith("cannot write results/tune/.manifest.json.tmp (Read-only file system): make it")


def test_a_full_results_disk_ends_the_stage_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A stage's output on a full disk (a 1 MB tmpfs, filled): one line naming the file and what to do, exit 1."""
    results = tmp_path / "results"
    results.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(results)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        with (results / "filler").open("wb") as filler, contextlib.suppress(OSError):
            filler.write(b"\0" * 2 * 1024**2)  # more than fits

        def stage(args: argparse.Namespace, params: object) -> int:
            write_json_atomic(results / "tune/manifest.json", {"trials": list(range(100_000))})
            return 0

        args = make_parser("a stage").parse_args(["--params", str(Path(__file__).parents[3] / "params.yaml")])
        with caplog.at_level(logging.ERROR):
            assert run(stage, args) == 1
    finally:
        subprocess.run(["umount", "-l", str(results)], check=False)
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(f"cannot write {results}/tune/manifest.json (No space left on device): free space")
