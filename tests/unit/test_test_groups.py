"""`make test`'s two workers: the integration tests split in two groups (each starts its own Ray, MLflow server and
project copy), the two-node cluster in one, the SLURM cluster in one, every other module on its own; a renamed module
must not drop out of its group silently."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FAULT_MODULES, GROUP_ORDER, xdist_scope

ROOT = Path(__file__).resolve().parents[2]


def test_every_fault_module_named_exists() -> None:
    assert sorted(m for m in FAULT_MODULES if not (ROOT / m).is_file()) == []


def test_tests_go_to_their_group() -> None:
    assert xdist_scope("tests/integration/test_orphans.py::test_x") == "local-ray-faults"
    assert xdist_scope("tests/integration/test_tune_pipeline.py::test_x[a]") == "local-ray"
    assert xdist_scope("tests/cluster/test_two_nodes.py::test_x") == "two-node-cluster"
    # The GPU nodes join the session's cluster: that module must run in the worker that started it.
    assert xdist_scope("tests/cluster/test_gpu_nodes.py::test_x") == "two-node-cluster"
    assert xdist_scope("tests/unit/test_layout.py::test_x") == "tests/unit/test_layout.py"
    assert xdist_scope("tests/cluster/test_slurm.py::test_x") == "slurm-cluster"
    assert set(GROUP_ORDER) == {"local-ray", "local-ray-faults", "two-node-cluster", "slurm-cluster"}
