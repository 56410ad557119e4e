"""System metrics sampled in the trial's worker: where it may write, what hardware it records.

The monitor itself on a real Ray worker and MLflow store: tests/integration/test_tune_pipeline.py (test_run_tree).
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.sweep.tracking.system_metrics import hardware_tags, reachable_here


def test_a_worker_writes_only_to_a_store_it_has(tmp_path: Path) -> None:
    database = tmp_path / "mlflow.db"
    assert not reachable_here(f"sqlite:///{database}")  # opening it would create an empty store on this node
    database.write_bytes(b"")
    assert reachable_here(f"sqlite:///{database}")
    assert reachable_here("http://127.0.0.1:5000")


def test_the_hardware_is_named() -> None:
    tags = hardware_tags()
    assert tags["host.cpu"] and int(tags["host.cpu_count"]) >= 1 and float(tags["host.memory_gb"]) > 0
    assert tags["torch.version"] == torch.__version__ and tags["torch.cuda"] == str(torch.version.cuda)
    assert ("host.gpu" in tags) == torch.cuda.is_available()
