"""Outputs are never half-written: a write that fails leaves the previous file whole, and no reader sees a part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.io import write_json_atomic


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
