"""A trial's check of its own node (``pipeline.trial.node_check``): the driver's marker seen in the sweep's storage,
an sqlite store only on the driver's node. On a real late-joining node: tests/cluster/test_two_nodes.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from pipeline.trial.node_check import MARKER, NodeCheck, check_node

DRIVER, OTHER = "d" * 56, "a" * 56


def test_a_node_that_sees_the_drivers_marker_passes(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text("token")
    check_node(NodeCheck("token", "/shared", DRIVER), pafs.LocalFileSystem(), str(tmp_path), OTHER, "10.0.0.2")
    check_node(None, pafs.LocalFileSystem(), str(tmp_path / "nowhere"), OTHER, "10.0.0.2")  # no check asked


@pytest.mark.parametrize("marker", [None, "another sweep's token"])
def test_a_node_that_does_not_see_it_names_the_key(tmp_path: Path, marker: str | None) -> None:
    if marker is not None:
        (tmp_path / MARKER).write_text(marker)
    check = NodeCheck("token", "/shared", DRIVER)
    with pytest.raises(ValueError, match=r"sweep.storage_path: /shared is not shared: node 10.0.0.2 \(aaaaaaaa\)"):
        check_node(check, pafs.LocalFileSystem(), str(tmp_path), OTHER, "10.0.0.2")


def test_an_sqlite_store_refuses_every_node_but_the_drivers(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text("token")
    check = NodeCheck("token", "/shared", DRIVER, store_refusal="tracking.uri: sqlite:///m.db is a file")
    check_node(check, pafs.LocalFileSystem(), str(tmp_path), DRIVER, "10.0.0.1")
    with pytest.raises(ValueError, match=r"tracking.uri: sqlite:///m.db .* node 10.0.0.2 \(aaaaaaaa\), which joined"):
        check_node(check, pafs.LocalFileSystem(), str(tmp_path), OTHER, "10.0.0.2")
